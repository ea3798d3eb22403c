"""The figures of a report over tenant A's fixture rows in ``PERIOD``, computed by hand.

Seven requests of A fall in the period (r1..r7; "before" and "at_end" are outside the half-open
period, r9 is tenant B's):

    name at        upstream model          path          outcome    attempts wasted  findings (attempt: kind, tool)
    r1   01-01 10h A        deepseek-chat  guarded       clean      1        -       -
    r2   01-01 11h A        deepseek-chat  guarded       recovered  2        50/1.5s 0: arguments-not-json read_file
    r3   01-01 12h qwen     qwen-coder     pass-through  clean      1        -       -
    r4   01-02 09h qwen     qwen-coder     guarded       exhausted  3        120/4s  0,1: schema-violation edit_file;
                                                                                     2: mid-stream-error-chunk
    r5   01-02 10h A        deepseek-chat  guarded       normalized 1        -       sse-comment-keepalives;
                                                                                     name-repeated-every-chunk read_file
    r7   01-02 11h A        deepseek-chat  guarded       repaired   1        -       code-fence-prefix-in-arguments
                                                                                     read_file
    r6   01-03 08h A        deepseek-chat  guarded       recovered  3        80/2.5s 0: arguments-not-json read_file;
                                                                                     1: upstream-timeout

r3 and r4 come from codex_cli_rs/0.9, the others from claude-cli/1.0.5. Completion tokens
100+150+80+120+90+110+200 = 850; prompt tokens 7 x 1000.
"""

from __future__ import annotations

from typing import Any

from tests.audit.conftest import AuditRows

#: The fixture rows carry no cost (money figures are tested in tests/billing and tests/e2e/test_money.py).
NO_MONEY = {"cost_usd": 0.0, "wasted_usd": 0.0, "unpriced": 0}
NO_WASTE = {"wasted_usd": 0.0}

ZERO_OUTCOMES = {"pending": 0, "clean": 0, "normalized": 0, "repaired": 0, "recovered-by-retry": 0, "exhausted": 0,
                 "upstream-error": 0, "client-cancelled": 0, "interrupted": 0, "rejected": 0}


def expected_figures(rows: AuditRows) -> dict[str, Any]:
    """Every figure but ``generated_at``."""
    a, qwen = rows.upstream_a.pk, rows.qwen_a.pk
    return {
        "schema_version": 1,
        "period": {"since": "2026-01-01T00:00:00Z", "until": "2026-01-04T00:00:00Z", "bucket": "day"},
        "scope": {"tenants": ["tenant-a"], "upstreams": None},
        "totals": {
            "requests": 7, "guarded": 6, "guarded_share": 0.8571, "touched": 5, "corrupted": 3,
            "corruption_rate": 0.5, "recovered": 2, "exhausted": 1, "attempts": 12, "prompt_tokens": 7000,
            "completion_tokens": 850, "wasted_completion_tokens": 250, "wasted_unknown_requests": 0,
            "wasted_seconds": 8.0, **NO_MONEY, "findings": 9,
            # Guarded attempts 1+2+3+1+1+3; with a finding: r2 #0, r4 #0-2, r5 #0, r7 #0, r6 #0-1; fatal
            # (retry): r2 #0, r4 #0-2, r6 #0-1.
            "guarded_attempts": 11, "faulty_attempts": 8, "attempt_fault_rate": 0.7273, "failed_attempts": 6,
        },
        "outcomes": {**ZERO_OUTCOMES, "clean": 2, "normalized": 1, "repaired": 1, "recovered-by-retry": 2,
                     "exhausted": 1},
        "by_upstream": [
            {"upstream_id": a, "upstream": "tenant-a-upstream", "tenant": "tenant-a", "requests": 5, "guarded": 5,
             "corrupted": 2, "corruption_rate": 0.4, "exhausted": 0, "wasted_completion_tokens": 130,
             "wasted_unknown_requests": 0, "wasted_seconds": 4.0, **NO_MONEY},
            {"upstream_id": qwen, "upstream": "tenant-a-qwen", "tenant": "tenant-a", "requests": 2, "guarded": 1,
             "corrupted": 1, "corruption_rate": 1.0, "exhausted": 1, "wasted_completion_tokens": 120,
             "wasted_unknown_requests": 0, "wasted_seconds": 4.0, **NO_MONEY},
        ],
        "by_model": [
            {"model": "deepseek-chat", "requests": 5, "guarded": 5, "corrupted": 2, "corruption_rate": 0.4,
             "exhausted": 0, "wasted_completion_tokens": 130, "wasted_unknown_requests": 0,
             "wasted_seconds": 4.0, **NO_MONEY},
            {"model": "qwen-coder", "requests": 2, "guarded": 1, "corrupted": 1, "corruption_rate": 1.0,
             "exhausted": 1, "wasted_completion_tokens": 120, "wasted_unknown_requests": 0,
             "wasted_seconds": 4.0, **NO_MONEY},
        ],
        "by_kind": [
            {"kind": "arguments-not-json", "findings": 2, "requests": 2, "fatal": 2, "share": 0.2857, **NO_WASTE},
            {"kind": "schema-violation", "findings": 2, "requests": 1, "fatal": 2, "share": 0.1429, **NO_WASTE},
            {"kind": "code-fence-prefix-in-arguments", "findings": 1, "requests": 1, "fatal": 0,
             "share": 0.1429, **NO_WASTE},
            {"kind": "mid-stream-error-chunk", "findings": 1, "requests": 1, "fatal": 1, "share": 0.1429, **NO_WASTE},
            {"kind": "name-repeated-every-chunk", "findings": 1, "requests": 1, "fatal": 0,
             "share": 0.1429, **NO_WASTE},
            {"kind": "sse-comment-keepalives", "findings": 1, "requests": 1, "fatal": 0, "share": 0.1429, **NO_WASTE},
            {"kind": "upstream-timeout", "findings": 1, "requests": 1, "fatal": 1, "share": 0.1429, **NO_WASTE},
        ],
        "over_time": [
            {"bucket": "2026-01-01T00:00:00Z", "requests": 3, "guarded": 2, "corrupted": 1, "corruption_rate": 0.5},
            {"bucket": "2026-01-02T00:00:00Z", "requests": 3, "guarded": 3, "corrupted": 1,
             "corruption_rate": 0.3333},
            {"bucket": "2026-01-03T00:00:00Z", "requests": 1, "guarded": 1, "corrupted": 1, "corruption_rate": 1.0},
        ],
        "over_time_by_upstream": [
            {"bucket": "2026-01-01T00:00:00Z", "upstream_id": a, "upstream": "tenant-a-upstream", "guarded": 2,
             "corrupted": 1, "corruption_rate": 0.5},
            {"bucket": "2026-01-02T00:00:00Z", "upstream_id": qwen, "upstream": "tenant-a-qwen", "guarded": 1,
             "corrupted": 1, "corruption_rate": 1.0},
            {"bucket": "2026-01-02T00:00:00Z", "upstream_id": a, "upstream": "tenant-a-upstream", "guarded": 2,
             "corrupted": 0, "corruption_rate": 0.0},
            {"bucket": "2026-01-03T00:00:00Z", "upstream_id": a, "upstream": "tenant-a-upstream", "guarded": 1,
             "corrupted": 1, "corruption_rate": 1.0},
        ],
        "over_time_by_model": [
            {"bucket": "2026-01-01T00:00:00Z", "model": "deepseek-chat", "guarded": 2, "corrupted": 1,
             "corruption_rate": 0.5},
            {"bucket": "2026-01-02T00:00:00Z", "model": "deepseek-chat", "guarded": 2, "corrupted": 0,
             "corruption_rate": 0.0},
            {"bucket": "2026-01-02T00:00:00Z", "model": "qwen-coder", "guarded": 1, "corrupted": 1,
             "corruption_rate": 1.0},
            {"bucket": "2026-01-03T00:00:00Z", "model": "deepseek-chat", "guarded": 1, "corrupted": 1,
             "corruption_rate": 1.0},
        ],
        "over_time_by_kind": [
            {"bucket": "2026-01-01T00:00:00Z", "kind": "arguments-not-json", "requests": 1},
            {"bucket": "2026-01-02T00:00:00Z", "kind": "code-fence-prefix-in-arguments", "requests": 1},
            {"bucket": "2026-01-02T00:00:00Z", "kind": "mid-stream-error-chunk", "requests": 1},
            {"bucket": "2026-01-02T00:00:00Z", "kind": "name-repeated-every-chunk", "requests": 1},
            {"bucket": "2026-01-02T00:00:00Z", "kind": "schema-violation", "requests": 1},
            {"bucket": "2026-01-03T00:00:00Z", "kind": "arguments-not-json", "requests": 1},
        ],
        "recovery_by_attempt": [
            {"attempt": 1, "requests": 3, "share": 0.6},
            {"attempt": 2, "requests": 1, "share": 0.2},
            {"attempt": 3, "requests": 1, "share": 0.2},
        ],
        "tools": [
            {"tool": "read_file", "findings": 4, "requests": 4, "fatal": 2},
            {"tool": "edit_file", "findings": 2, "requests": 1, "fatal": 2},
        ],
        "clients": [
            {"user_agent": "claude-cli/1.0.5", "requests": 5, "guarded": 5, "corrupted": 2, "corruption_rate": 0.4,
             "exhausted": 0, "wasted_completion_tokens": 130, "wasted_unknown_requests": 0,
             "wasted_seconds": 4.0, **NO_MONEY},
            {"user_agent": "codex_cli_rs/0.9", "requests": 2, "guarded": 1, "corrupted": 1, "corruption_rate": 1.0,
             "exhausted": 1, "wasted_completion_tokens": 120, "wasted_unknown_requests": 0,
             "wasted_seconds": 4.0, **NO_MONEY},
        ],
    }


def without_generated_at(figures: dict[str, Any]) -> dict[str, Any]:
    """``figures`` minus the one field that depends on the clock."""
    return {key: value for key, value in figures.items() if key != "generated_at"}


def expected_report_figures(rows: AuditRows) -> dict[str, Any]:
    """``expected_figures`` plus what only built reports carry: ``by_member`` (no request of the fixture has a
    member: one row of tenant keys; incidents = 1 exhausted + 2 recovered)."""
    return {**expected_figures(rows), "by_member": [
        {"member_id": None, "member": "(tenant keys)", "tenant": "tenant-a", "requests": 7, "prompt_tokens": 7000,
         "completion_tokens": 850, "wasted_prompt_tokens": 0, "wasted_completion_tokens": 250,
         "wasted_unknown_requests": 0, "wasted_seconds": 8.0, **NO_MONEY, "corrupted": 3, "corruption_rate": 0.5,
         "exhausted": 1, "recovered": 2,
         "loops_broken": 0, "limits_hit": 0, "retry_budget_spent": 0, "incidents": 3}]}
