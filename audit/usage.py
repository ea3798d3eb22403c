"""Usage per virtual key, tenant, model or upstream over a period (issue 14, item 5): the figures, pure ORM.

One row per value of the chosen dimension (``GROUPS``), from the scope's requests (``audit.reports.Scope``:
period by the request's start, tenants already narrowed to what the user may see):

- ``requests``; ``prompt_tokens`` / ``completion_tokens``: input and output tokens over every attempt
  (as the upstream reported them; ``ProxyRequest`` sums its attempts);
- ``wasted_prompt_tokens``: input tokens of failed attempts (``Attempt`` rows whose outcome is
  ``retry`` or ``upstream-error``); ``wasted_completion_tokens`` and ``wasted_seconds``: output tokens
  and time of failed attempts (``ProxyRequest.wasted_completion_tokens`` / ``wasted_ms``);
  ``wasted_unknown_requests``: requests among them whose wasted usage is unknown (``audit.display``'s one rule:
  the pages and the CSV then read ``≥ N`` or ``unknown``, not the bare sum);
- ``limits_hit``: requests refused by a limit, i.e. recorded with status 429 and outcome ``rejected``
  (limit refusals happen before any upstream call; only those recorded as audit rows are counted);
- ``cost_usd`` / ``wasted_usd``: USD of every attempt and of the failed ones (``billing``, at the prices in
  force when each request ran); ``unpriced``: requests whose model had no price (not in the sums);
- ``loops_broken``: ``agent-loop`` findings (the loop breaker's); ``retry_budget_spent``:
  ``retry-budget-spent`` findings (a retry the tenant's retry budget refused).

Plus the same totals per time bucket for the charts. Four grouped queries and one per-bucket query.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce

from audit.display import wasted_usage_unknown
from audit.models import Attempt
from audit.reports import Scope, _bucket_of, _iso, buckets, seconds

#: Failed attempts' outcomes (``proxy.guard.turn.Outcome`` values of unusable attempts).
FAILED_ATTEMPTS = ("retry", "upstream-error")
#: The loop breaker's and the retry budget's finding kinds (``proxy.guard.findings.FindingKind``).
AGENT_LOOP, RETRY_BUDGET_SPENT = "agent-loop", "retry-budget-spent"
LIMIT_HIT = Q(status=429, outcome="rejected")


@dataclass(frozen=True, slots=True)
class Group:
    """A dimension: the ``ProxyRequest`` field grouped on and the fields that label a row."""

    field: str
    label_fields: tuple[str, ...]


GROUPS: dict[str, Group] = {
    "key": Group("api_key_id", ("api_key__prefix", "api_key__name", "tenant__slug")),
    "tenant": Group("tenant_id", ("tenant__slug",)),
    "model": Group("model", ()),
    "upstream": Group("upstream_id", ("upstream__name", "tenant__slug")),
}
COLUMNS = ("group", "requests", "prompt_tokens", "completion_tokens", "wasted_prompt_tokens",
           "wasted_completion_tokens", "wasted_seconds", "limits_hit", "loops_broken", "retry_budget_spent",
           "cost_usd", "wasted_usd", "unpriced")


def _label(group: str, row: dict[str, Any]) -> str:
    if group == "key":
        prefix = row.get("api_key__prefix")
        return f"{row['tenant__slug']} / tr-{prefix} ({row['api_key__name']})" if prefix else "(no key)"
    if group == "tenant":
        return str(row.get("tenant__slug") or "")
    if group == "upstream":
        name = row.get("upstream__name")
        return f"{row['tenant__slug']} / {name}" if name else "(no upstream)"
    return str(row.get("model") or "")


def _totals() -> dict[str, Any]:
    return {"n_requests": Count("pk"), "n_prompt": Coalesce(Sum("prompt_tokens"), 0),
            "n_completion": Coalesce(Sum("completion_tokens"), 0),
            "n_wasted_completion": Coalesce(Sum("wasted_completion_tokens"), 0),
            "n_wasted_ms": Coalesce(Sum("wasted_ms"), 0.0), "n_limits": Count("pk", filter=LIMIT_HIT),
            "n_cost": Coalesce(Sum("cost_usd"), Decimal(0)), "n_wasted_usd": Coalesce(Sum("wasted_usd"), Decimal(0)),
            "n_unpriced": Count("pk", filter=Q(unpriced=True)),
            "n_wasted_unknown": Count("pk", filter=wasted_usage_unknown())}


def usage_rows(scope: Scope, group: str) -> list[dict[str, Any]]:
    """One row per value of ``group`` (a ``GROUPS`` key; ``KeyError`` otherwise) with ``COLUMNS`` (``group``
    is the row's label) and ``id`` (the grouped value), most requests first."""
    dim = GROUPS[group]
    rows = list(scope.requests().values(dim.field, *dim.label_fields).annotate(**_totals()))
    wasted = {r["key"]: r["n"] for r in Attempt.objects.filter(request__in=scope.requests(),
                                                                outcome__in=FAILED_ATTEMPTS)
              .values(key=F(f"request__{dim.field}")).annotate(n=Coalesce(Sum("prompt_tokens"), 0))}
    findings = scope.findings().filter(kind__in=(AGENT_LOOP, RETRY_BUDGET_SPENT))
    counted: dict[tuple[Any, str], int] = {(r["key"], r["kind"]): r["n"] for r in findings.values(
        "kind", key=F(f"request__{dim.field}")).annotate(n=Count("pk"))}
    out = []
    for r in rows:
        key = r[dim.field]
        out.append({"id": key, "group": _label(group, r), "requests": r["n_requests"], "prompt_tokens": r["n_prompt"],
                    "completion_tokens": r["n_completion"], "wasted_prompt_tokens": wasted.get(key, 0),
                    "wasted_completion_tokens": r["n_wasted_completion"],
                    "wasted_unknown_requests": r["n_wasted_unknown"],
                    "wasted_seconds": seconds(r["n_wasted_ms"]), "limits_hit": r["n_limits"],
                    "loops_broken": counted.get((key, AGENT_LOOP), 0),
                    "retry_budget_spent": counted.get((key, RETRY_BUDGET_SPENT), 0),
                    "cost_usd": round(float(r["n_cost"]), 10), "wasted_usd": round(float(r["n_wasted_usd"]), 10),
                    "unpriced": r["n_unpriced"]})
    return sorted(out, key=lambda r: (-r["requests"], r["group"]))


def usage_over_time(scope: Scope) -> list[dict[str, Any]]:
    """Per bucket of the period (every bucket present): requests, tokens in and out, wasted output tokens."""
    rows = {r["bucket"]: r for r in scope.requests().annotate(bucket=_bucket_of(scope, "created"))
            .values("bucket").annotate(**_totals())}
    out = []
    for start in buckets(scope):
        r = rows.get(start, {})
        out.append({"bucket": _iso(start), "requests": r.get("n_requests", 0), "prompt_tokens": r.get("n_prompt", 0),
                    "completion_tokens": r.get("n_completion", 0),
                    "wasted_completion_tokens": r.get("n_wasted_completion", 0)})
    return out
