"""Events the attempt guard hands to the relay (see ``proxy.guard.decisions.attempt.AttemptGuard``).

``feed()`` returns ``TextDelta``, ``ToolCallValid``, ``Finding`` and ``Abort`` events in stream
order; ``finish()`` returns the remaining ones and ends with exactly one ``Done`` (or ``Pending``,
when validations must first run off the event loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.guard.checks.validate import Offloaded
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


@dataclass(frozen=True, slots=True)
class Pending:
    """``finish()`` needs the verdicts of ``checks`` (validations over the inline budget) before it can
    decide: the caller runs them off the event loop, hands them to ``AttemptGuard.supply`` and calls
    ``finish()`` again. Then the last event of ``finish()``, in place of ``Done``."""

    checks: tuple[Offloaded, ...]


Event = TextDelta | ToolCallValid | Finding | Abort | Done | Pending
