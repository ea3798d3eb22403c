"""Guard policy: what the guard may repair and what the relay does when an attempt is unusable.

Stored per tenant (defaults) and per route (overrides) in ``tenants``; the guard core only sees
this frozen value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Repair(enum.StrEnum):
    """Deterministic repairs the policy can allow (fault cases named after each)."""

    CONTROL_CHARACTERS = "control-characters"  # raw control characters inside JSON strings (C21)
    STRAY_ESCAPES = "stray-escapes"  # backslash escapes outside JSON strings
    CODE_FENCE = "code-fence"  # ```json fences / "json" tag residue around arguments (C23)
    DOUBLE_ENCODED = "double-encoded"  # schema-guided unwrapping of JSON-in-a-string (C20)
    NAME_PREFIX = "name-prefix"  # "functions." / "default_api." template prefixes (C46)
    LEAKED_MARKUP = "leaked-markup"  # tool calls leaked into text as model markup (C26-C31)
    # parallel_tool_calls false but the upstream sent several calls: keep the first (the one a named
    # tool_choice forces, if any); the client asks for the next step on its next turn.
    EXTRA_PARALLEL_CALLS = "extra-parallel-calls"
    # arguments missing their opening brace ('"city": "Paris"}'): the one reading that adds it (proxy.guard.reading)
    MISSING_BRACE = "missing-brace"


DETERMINISTIC_REPAIRS: frozenset[Repair] = frozenset(Repair)


class Exhaustion(enum.StrEnum):
    """What a streaming client gets when toolrelay ends a tool turn without a usable answer (attempts
    exhausted, the retry budget spent, the loop breaker).

    Chosen by running Claude Code, Codex CLI, OpenCode and Qwen Code headless and interactive against
    each candidate shape (docs/clients.md, "How a turn ends"): only ``fail`` makes every headless run
    exit with a failure status while each agent shows the message once and does not retry.
    """

    FAIL = "fail"  # the protocol's terminal, non-retryable error: agents stop, headless runs fail
    MESSAGE = "message"  # a terminal assistant message saying what failed (headless runs report success)
    ERROR = "error"  # the protocol's retryable in-stream error (Claude Code and Codex retry it)


class FragmentStorage(enum.StrEnum):
    """How much of the raw upstream body the audit keeps."""

    ATTEMPT = "attempt"  # the whole attempt body (capped)
    OFFENDING = "offending"  # only the frames a finding points at
    NONE = "none"


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    """Policy values with their product defaults.

    ``max_retries``: further upstream attempts after the first (so at most ``1 + max_retries``
    calls); ``stream_text``: release text live in guarded requests; ``early_abort``: stop reading a
    provably broken attempt; ``commit_deadline`` / ``keepalive_interval`` in seconds.

    The loop breaker (``proxy.guard.decisions.loops``): ``loop_breaker`` on or off; ``loop_repeats``: the
    delivery of one call that is stopped when the previous ones in a row had identical results (4: the
    4th); ``loop_cycle_repeats``: the repetition of a 2- or 3-call cycle that is stopped (3);
    ``loop_exhausted_turns``: the exhausted turn in a row that gets the stuck answer (3);
    ``loop_exempt_tools``: tool names never counted (polling tools). ``retry_budget_percent``: retries
    caused by broken upstream output may add at most this share to the tenant's upstream calls over
    the retry-budget window (``settings.RETRY_BUDGET_WINDOW_SECONDS``, 10 minutes). ``trace_content``:
    traces carry finding details and the delivered turn, scrubbed (``proxy.telemetry.spans``; off: no content).
    """

    max_retries: int = 2
    stream_text: bool = True
    early_abort: bool = True
    exhaustion: Exhaustion = Exhaustion.FAIL
    repairs: frozenset[Repair] = field(default_factory=lambda: DETERMINISTIC_REPAIRS)
    fragments: FragmentStorage = FragmentStorage.OFFENDING
    retention_days: int = 30
    commit_deadline: float = 5.0
    keepalive_interval: float = 10.0
    loop_breaker: bool = True
    loop_repeats: int = 4
    loop_cycle_repeats: int = 3
    loop_exhausted_turns: int = 3
    loop_exempt_tools: frozenset[str] = frozenset()
    retry_budget_percent: int = 50
    trace_content: bool = False

    def allows(self, repair: Repair) -> bool:
        """True when ``repair`` is allowed."""
        return repair in self.repairs
