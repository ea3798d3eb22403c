"""The canonical assistant turn, the request facts the guard validates against, and the decision.

Shapes follow OpenAI Chat Completions (PROTOCOLS.md section 1): a turn has one or more choices
(``n``), each with text, reasoning (DeepSeek's ``reasoning_content``), refusal, tool calls and a
finish reason; usage is per turn.
"""

from __future__ import annotations

import enum
import math
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from proxy.guard.findings import Finding

_ID_ALPHABET = string.ascii_letters + string.digits


def synthesize_call_id() -> str:
    """A fresh tool-call id ``call_`` + 24 random alphanumerics (C08)."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(slots=True)
class ToolCall:
    """One complete tool call. ``arguments`` is a strict-JSON object text (``"{}"`` at least).

    ``extra`` holds provider extension fields seen on the call (e.g. Gemini's ``extra_content``,
    fault case C10) so they can be round-tripped to the client.
    """

    id: str
    name: str
    arguments: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ChoiceTurn:
    """One choice of a turn. ``finish_reason`` is ``stop | length | tool_calls | content_filter`` or None."""

    index: int = 0
    content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(slots=True)
class Turn:
    """A whole assistant turn: upstream identity (``id``, ``model``, ``created`` unix seconds), choices, usage.

    ``usage`` is the upstream's OpenAI usage object (``prompt_tokens``, ``completion_tokens``,
    ``total_tokens``, optional details) or None when the upstream sent none.
    """

    id: str | None = None
    model: str | None = None
    created: int | None = None
    system_fingerprint: str | None = None
    choices: list[ChoiceTurn] = field(default_factory=list)
    usage: dict[str, Any] | None = None

    def choice(self, index: int) -> ChoiceTurn:
        """Return the choice with ``index``, creating it (and keeping ``choices`` sorted) if absent."""
        for c in self.choices:
            if c.index == index:
                return c
        c = ChoiceTurn(index=index)
        self.choices.append(c)
        self.choices.sort(key=lambda x: x.index)
        return c


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One declared function tool: ``name`` and its JSON Schema ``parameters`` (None = no parameters)."""

    name: str
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What the client's request says about tools (OpenAI Chat terms, PROTOCOLS.md 1.1).

    ``tool_choice`` is ``"auto" | "none" | "required"`` or the name of one forced function;
    ``parallel_tool_calls`` False means at most one call per choice; ``n`` is the number of choices;
    ``usage_requested``: the upstream was asked for a usage chunk (so one is not a finding);
    ``inline_cost``: the validation budget of one call on the event loop (``schema_bounds.SchemaBounds``;
    infinite unless ``proxy.guard.checks.request.prepare`` set it, so a bare spec validates everything inline);
    ``inline_check_nodes``: a schema not in the compiled-schema cache with more JSON values than this is
    not compiled on the event loop (its calls are validated in the pool).
    """

    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    n: int = 1
    usage_requested: bool = False  # the upstream request had stream_options.include_usage
    inline_cost: float = math.inf
    inline_check_nodes: int = 2**62

    @property
    def names(self) -> frozenset[str]:
        """The declared tool names."""
        return frozenset(t.name for t in self.tools)

    @classmethod
    def from_openai(cls, body: dict[str, Any]) -> RequestSpec:
        """Build from an OpenAI chat.completions request body; unknown shapes are tolerated."""
        tools: list[ToolSpec] = []
        for t in body.get("tools") or ():
            if not isinstance(t, dict):
                continue
            fn = t.get("function") if isinstance(t.get("function"), dict) else None
            if fn and isinstance(fn.get("name"), str):
                params = fn.get("parameters")
                tools.append(ToolSpec(fn["name"], params if isinstance(params, dict) else None))
        choice = body.get("tool_choice", "auto")
        if isinstance(choice, dict):
            named = choice.get("function")
            name = named.get("name") if isinstance(named, dict) else None
            choice = name if isinstance(name, str) else "auto"
        elif choice not in ("auto", "none", "required"):
            choice = "auto"
        n = body.get("n")
        options = body.get("stream_options")
        return cls(
            usage_requested=isinstance(options, dict) and options.get("include_usage") is True,
            tools=tuple(tools),
            tool_choice=choice,
            parallel_tool_calls=body.get("parallel_tool_calls") is not False,
            n=n if isinstance(n, int) and 1 <= n <= 128 else 1,
        )


class Outcome(enum.StrEnum):
    """The guard's verdict on one attempt."""

    CLEAN = "clean"  # nothing absorbed
    NORMALIZED = "normalized"  # dialect quirks absorbed, no repair
    REPAIRED = "repaired"  # at least one deterministic repair
    RETRY = "retry"  # unusable turn; retry the upstream
    UPSTREAM_ERROR = "upstream-error"  # the upstream reported an error (see ``UpstreamError.retryable``)


@dataclass(frozen=True, slots=True)
class UpstreamError:
    """An error reported by the upstream, in HTTP or in band.

    ``status`` is the HTTP status to give the client (the upstream's, or 502 for in-band errors
    without one); ``type`` / ``code`` / ``message`` come from the upstream's error object.
    """

    status: int
    message: str
    type: str = "upstream_error"
    code: str | None = None
    retryable: bool = True
    retry_after: float | None = None  # seconds, from Retry-After, when the upstream gave one


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on one attempt: the turn to emit (when usable), why not, and every finding."""

    outcome: Outcome
    turn: Turn | None
    findings: tuple[Finding, ...] = ()
    reason: str = ""  # for RETRY: the first fatal finding's detail
    error: UpstreamError | None = None

    @property
    def usable(self) -> bool:
        """True when ``turn`` may be emitted to the client."""
        return self.outcome in (Outcome.CLEAN, Outcome.NORMALIZED, Outcome.REPAIRED)
