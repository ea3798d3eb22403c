"""What the client of a guarded stream has been sent, what is held, and what a retry may still send.

One ``Delivery`` per client request, across its attempts (sans-IO: the relay sends what it returns).

- ``begin()`` starts an attempt. Text streams live (``offer`` returns the delta to send) when the
  policy streams text and nothing was sent by an earlier attempt; otherwise it is held.
- ``settle(turn)`` says what to send before the turn's tool calls and finish, for a usable turn:
  the held text of a first-time attempt; after a retry that follows streamed text, the issue rule:
  a choice with tool calls sends only its tool calls (its text would contradict what the client
  already read), a text-only choice sends its text minus the prefix the client already has
  (``os.path.commonprefix`` of what was sent and what the retry said).
- ``exhaustion_separator`` sets the exhaustion answer apart from text the client already has.
"""

from __future__ import annotations

import os

from proxy.guard.events import TextDelta
from proxy.guard.turn import Turn

_Key = tuple[int, str]


class Delivery:
    """Text state of one response. ``stream_text``: the policy releases guarded text live."""

    __slots__ = ("stream_text", "_sent", "_held", "_live", "_after_text")

    def __init__(self, *, stream_text: bool) -> None:
        self.stream_text = stream_text
        self._sent: dict[_Key, list[str]] = {}
        self._held: list[TextDelta] = []
        self._live = stream_text
        self._after_text = False  # this attempt follows one that sent text

    @property
    def sent_text(self) -> bool:
        """True once any text reached the client."""
        return bool(self._sent)

    @property
    def channels(self) -> set[tuple[int, str]]:
        """The ``(choice, channel)`` pairs the client has text of."""
        return set(self._sent)

    def sent(self, choice: int, channel: str) -> str:
        """The text of ``choice`` / ``channel`` the client has received."""
        return "".join(self._sent.get((choice, channel), ()))

    def begin(self, *, continuing: bool = False) -> None:
        """A new attempt starts: drop what the previous one held; stream live only if nothing was sent, or
        when the attempt ``continuing`` the text the client has (its deltas are the rest of that text)."""
        self._held = []
        self._after_text = self.sent_text and not continuing
        self._live = (self.stream_text and not self._after_text) or continuing

    def offer(self, delta: TextDelta) -> TextDelta | None:
        """The delta to send now (recorded as sent), or None when it is held."""
        if not self._live:
            self._held.append(delta)
            return None
        self._record(delta)
        return delta

    def settle(self, turn: Turn) -> list[TextDelta]:
        """The text to send before ``turn``'s tool calls and finish (recorded as sent)."""
        out = self._held if not self._after_text else self._retry_remainder(turn)
        self._held = []
        for delta in out:
            self._record(delta)
        return out

    def exhaustion_separator(self) -> str:
        """``"\\n\\n"`` when the client already has text (the exhaustion answer is set apart), else ``""``."""
        return "\n\n" if self.sent_text else ""

    def _retry_remainder(self, turn: Turn) -> list[TextDelta]:
        with_calls = {c.index for c in turn.choices if c.tool_calls}
        texts: dict[_Key, list[str]] = {}
        for delta in self._held:
            if delta.choice not in with_calls:
                texts.setdefault((delta.choice, delta.channel), []).append(delta.text)
        out = []
        for (choice, channel), parts in texts.items():
            text = "".join(parts)
            sent = self.sent(choice, channel)
            remainder = text[len(os.path.commonprefix([sent, text])):]
            if remainder:
                out.append(TextDelta(choice, channel, remainder))  # type: ignore[arg-type]
        return out

    def _record(self, delta: TextDelta) -> None:
        self._sent.setdefault((delta.choice, delta.channel), []).append(delta.text)
