"""Events the attempt guard hands to the relay (see ``proxy.guard.attempt.AttemptGuard``).

``feed()`` returns ``TextDelta``, ``ToolCallValid``, ``Finding`` and ``Abort`` events in stream
order; ``finish()`` returns the remaining ones and ends with exactly one ``Done``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.guard.findings import Finding
from proxy.guard.turn import Decision, ToolCall

Channel = Literal["content", "reasoning", "refusal"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Text that is safe to release to a live client now (leaked-markup prefixes held back)."""

    choice: int
    channel: Channel
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallValid:
    """A tool call that is complete and valid before the end of the stream (commit trigger only)."""

    choice: int
    slot: int
    call: ToolCall


@dataclass(frozen=True, slots=True)
class Abort:
    """The attempt is provably unrecoverable: stop reading the upstream and retry at once."""

    finding: Finding


@dataclass(frozen=True, slots=True)
class Done:
    """The verdict on the attempt; always the last event of ``finish()``."""

    decision: Decision


Event = TextDelta | ToolCallValid | Finding | Abort | Done
