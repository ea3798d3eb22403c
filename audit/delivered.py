"""What the client received at the end of a request, as a small capped summary for the audit.

The relay builds it once, when the response ends, and passes it in ``RequestResult.delivered``;
``ProxyRequest.delivered`` stores it (JSON) and the request page shows it. Shapes (``kind`` says which):

- ``{"kind": "turn", "choices": [{"index", "finish_reason", "text", "text_chars", "reasoning_chars",
  "tool_calls": [{"name", "arguments", "arguments_chars"}]}]}``: the canonical turn the emitter
  rendered (``text`` and ``arguments`` capped at ``TEXT_CAP`` / ``ARGUMENTS_CAP`` characters; the
  ``*_chars`` fields give the full lengths);
- ``{"kind": "exhausted", "message", "as_error"}``: the policy's exhaustion answer (a terminal
  assistant message, or the in-stream error when ``as_error``);
- ``{"kind": "error", "status", "message"}``: an error the client got instead of a turn.

With ``content=False`` (the tenant keeps no fragments, policy ``none``) texts and arguments are left
out and only names, lengths and finish reasons are kept. ``scrub`` (the relay's credential
redaction) is applied to every text kept. Sans-IO: no Django imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.guard.turn import ChoiceTurn, ToolCall, Turn

TEXT_CAP = 2000
ARGUMENTS_CAP = 2000
MAX_CHOICES = 4
MAX_CALLS = 16

Scrub = Callable[[str], str]


def _cap(text: str, cap: int) -> str:
    return text if len(text) <= cap else text[:cap] + "…"


def _keep(text: str | None, cap: int, *, content: bool, scrub: Scrub | None) -> str | None:
    if not content or text is None:
        return None
    return _cap(scrub(text) if scrub else text, cap)


def _call(call: ToolCall, *, content: bool, scrub: Scrub | None) -> dict[str, Any]:
    arguments = _keep(call.arguments, ARGUMENTS_CAP, content=content, scrub=scrub)
    return {"name": _cap(call.name, 200), "arguments": arguments, "arguments_chars": len(call.arguments)}


def _choice(choice: ChoiceTurn, *, content: bool, scrub: Scrub | None) -> dict[str, Any]:
    return {
        "index": choice.index,
        "finish_reason": choice.finish_reason,
        "text": _keep(choice.content, TEXT_CAP, content=content, scrub=scrub),
        "text_chars": len(choice.content or ""),
        "reasoning_chars": len(choice.reasoning or ""),
        "tool_calls": [_call(c, content=content, scrub=scrub) for c in choice.tool_calls[:MAX_CALLS]],
        "more_tool_calls": max(0, len(choice.tool_calls) - MAX_CALLS),
    }


def delivered_turn(turn: Turn, *, content: bool = True, scrub: Scrub | None = None) -> dict[str, Any]:
    """The summary of a usable turn sent to the client (``kind: "turn"``)."""
    return {"kind": "turn", "choices": [_choice(c, content=content, scrub=scrub) for c in turn.choices[:MAX_CHOICES]]}


def delivered_exhaustion(message: str, *, as_error: bool = False, content: bool = True,
                         scrub: Scrub | None = None) -> dict[str, Any]:
    """The exhaustion answer (message text, or the in-stream error's message when ``as_error``).

    The message is toolrelay's own sentence (attempts, last problem, request id), so it is kept
    even without ``content``.
    """
    return {"kind": "exhausted", "message": _keep(message, TEXT_CAP, content=True, scrub=scrub), "as_error": as_error}


def delivered_error(status: int, message: str, *, scrub: Scrub | None = None) -> dict[str, Any]:
    """An error answer (HTTP error before the commit, or an in-stream error after it)."""
    return {"kind": "error", "status": status, "message": _keep(message, TEXT_CAP, content=True, scrub=scrub)}
