"""The sans-IO stream guard: bytes and dicts in, events, findings and decisions out.

No Django, Channels, httpx or asyncio imports anywhere in this package (ARCHITECTURE.md).
Public API re-exported here; one import per line so parallel additions merge cleanly.
"""

from __future__ import annotations

from proxy.guard.checks.repair import resolve_name
from proxy.guard.checks.validate import check_turn
from proxy.guard.decisions.attempt import AttemptGuard, decide_completion, guard_body
from proxy.guard.events import Abort, Channel, Done, Event, TextDelta, ToolCallValid
from proxy.guard.findings import Action, Finding, FindingKind, Severity
from proxy.guard.policy import GuardPolicy, Repair
from proxy.guard.protocols.emit import Emitter
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter
from proxy.guard.stream.accumulate import Accumulator, SlotClosed
from proxy.guard.stream.errors import classify_inband_error, http_error_decision
from proxy.guard.stream.markup import MarkupScanner, extract_markup
from proxy.guard.stream.sse import SSEDecoder, SSEEvent, encode_comment, encode_data, encode_done, encode_event
from proxy.guard.turn import (
    ChoiceTurn,
    Decision,
    Outcome,
    RequestSpec,
    ToolCall,
    ToolSpec,
    Turn,
    UpstreamError,
    synthesize_call_id,
)

__all__ = [
    "Abort",
    "Accumulator",
    "Action",
    "AttemptGuard",
    "Channel",
    "ChoiceTurn",
    "Decision",
    "Done",
    "Emitter",
    "Event",
    "Finding",
    "OpenAIChatEmitter",
    "FindingKind",
    "GuardPolicy",
    "MarkupScanner",
    "Outcome",
    "Repair",
    "RequestSpec",
    "SSEDecoder",
    "SSEEvent",
    "Severity",
    "SlotClosed",
    "TextDelta",
    "ToolCall",
    "ToolCallValid",
    "ToolSpec",
    "Turn",
    "UpstreamError",
    "check_turn",
    "classify_inband_error",
    "decide_completion",
    "encode_comment",
    "encode_data",
    "encode_done",
    "encode_event",
    "extract_markup",
    "guard_body",
    "http_error_decision",
    "resolve_name",
    "synthesize_call_id",
]
