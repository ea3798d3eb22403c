"""The content-block state machine of one Anthropic Messages stream (PROTOCOLS.md 2.3, section 0 items 10-11).

``ContentBlocks`` turns a sequence of text, thinking and tool-use pieces, in any order and
combination, into ``content_block_start`` / ``content_block_delta`` / ``content_block_stop``
events that obey the protocol:

- at most one block is open; a piece of another kind closes it first, so a delta is never sent
  inside a block of another type (a ``thinking_delta`` only in a thinking block, a ``text_delta``
  only in a text block, ``input_json_delta`` only in a tool_use block);
- block indexes are 0, 1, 2… in ``content_block_start`` order (the Python SDK appends on start
  and looks blocks up by index, 0.11); every start carries the empty payload the SDK builds on (0.10);
- a thinking block gets its ``signature_delta`` "just before its ``content_block_stop``" (2.3);
- whitespace-only text that would open a new text block is held: it goes out as the start of the
  next text block once non-whitespace text arrives, is released as a text block of its own at the
  end of a turn without tool calls (``release()``), and is dropped when a tool_use block follows.
  Claude Code renders an empty or whitespace-only text block before a tool call as a blank
  assistant message (issue 13). Holding does not close an open thinking block, so reasoning that
  continues after a stray newline stays one block.

States: ``IDLE`` (no block open), ``TEXT``, ``THINKING``. Transitions (``held`` = whitespace held):

    IDLE | THINKING  + text, held+text blank   -> held += text            (state unchanged)
    IDLE | THINKING  + text, else              -> stop; start text; delta(held+text); held = ""  -> TEXT
    TEXT             + text                    -> delta                                           -> TEXT
    IDLE | TEXT      + thinking                -> stop; start thinking; delta                     -> THINKING
    THINKING         + thinking                -> delta                                           -> THINKING
    any              + tool_use                -> stop; held = ""; start; input_json_delta…; stop -> IDLE
    any              + release                 -> held non-empty: stop; start text; delta; stop   -> IDLE
    any              + stop                    -> close the open block (signature first)          -> IDLE

Sans-IO: methods return the bytes to send (possibly ``b""``).
"""

from __future__ import annotations

import base64
import enum
import hashlib
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii  # the C escaper json.dumps itself uses for str
from typing import Any

from proxy.guard.stream.sse import encode_event

#: Argument text is sent in slices of at most this many characters (one ``input_json_delta`` each).
ARGUMENT_SLICE = 4096
#: Prefix of the signatures this proxy puts on thinking blocks.
SIGNATURE_PREFIX = "trly1"


def thinking_signature(thinking: str) -> str:
    """The signature for a thinking block: ``trly1`` + base64url of the text's SHA-256.

    Opaque to clients (Anthropic's are base64 too); the proxy can tell its own blocks from others.
    """
    digest = hashlib.sha256(thinking.encode("utf-8")).digest()
    return SIGNATURE_PREFIX + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


class BlockState(enum.Enum):
    """Which content block is open."""

    IDLE = "idle"
    TEXT = "text"
    THINKING = "thinking"


class ContentBlocks:
    """Content-block events for one message; see the module docstring for the transitions."""

    def __init__(self) -> None:
        self.state = BlockState.IDLE
        self.count = 0  # blocks started so far; the open block (if any) has index count - 1
        self.held = ""  # whitespace-only text waiting for a text block
        self._thinking: list[str] = []  # text of the open thinking block (for its signature)
        self._delta_head: tuple[BlockState, int, str] | None = None

    # -- pieces ----------------------------------------------------------------------------------

    def text(self, text: str) -> bytes:
        """A piece of visible text (content or refusal)."""
        if not text:
            return b""
        if self.state == BlockState.TEXT:
            return self._delta(BlockState.TEXT, text)
        if not (self.held + text).strip():
            self.held += text
            return b""
        opening = self.stop() + self._start(BlockState.TEXT)
        text, self.held = self.held + text, ""
        return opening + self._delta(BlockState.TEXT, text)

    def thinking(self, text: str) -> bytes:
        """A piece of reasoning."""
        if not text:
            return b""
        out = b""
        if self.state != BlockState.THINKING:
            out = self.stop() + self._start(BlockState.THINKING)
        self._thinking.append(text)
        return out + self._delta(BlockState.THINKING, text)

    def tool_use(self, call_id: str, name: str, arguments: str) -> bytes:
        """A whole tool_use block whose ``input_json_delta`` fragments concatenate to ``arguments``."""
        out = [self.stop()]
        self.held = ""  # a blank text block before a tool_use is what Claude Code renders (issue 13)
        out.append(self._block_start({"type": "tool_use", "id": call_id, "name": name, "input": {}}))
        index = self.count - 1
        for piece in _slices(arguments or "{}"):
            out.append(encode_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                            "delta": {"type": "input_json_delta",
                                                                      "partial_json": piece}}))
        out.append(_block_stop(index))
        return b"".join(out)

    def release(self) -> bytes:
        """End of the visible text: held whitespace becomes a text block of its own (nothing follows it)."""
        if not self.held:
            return self.stop()
        out = self.stop() + self._start(BlockState.TEXT)
        text, self.held = self.held, ""
        return out + self._delta(BlockState.TEXT, text) + self.stop()

    def stop(self) -> bytes:
        """Close the open block, if any (a thinking block gets its ``signature_delta`` first)."""
        if self.state == BlockState.IDLE:
            return b""
        index = self.count - 1
        out = b""
        if self.state == BlockState.THINKING:
            signature = thinking_signature("".join(self._thinking))
            out = encode_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                       "delta": {"type": "signature_delta", "signature": signature}})
        self.state = BlockState.IDLE
        return out + _block_stop(index)

    # -- framing ---------------------------------------------------------------------------------

    def _start(self, state: BlockState) -> bytes:
        """``content_block_start`` for a text or thinking block (PROTOCOLS.md 0.10 payloads)."""
        block = {"type": "text", "text": ""} if state == BlockState.TEXT else {"type": "thinking", "thinking": "",
                                                                                "signature": ""}
        out = self._block_start(block)
        self.state = state
        self._thinking = []
        return out

    def _block_start(self, block: dict[str, Any]) -> bytes:
        index = self.count
        self.count += 1
        return encode_event("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": block})

    def _delta(self, state: BlockState, text: str) -> bytes:
        """One text / thinking delta in the open block; the constant part is built once per block."""
        index = self.count - 1
        cached = self._delta_head
        if cached is None or cached[:2] != (state, index):
            kind = state.value
            head = ('event: content_block_delta\ndata: {"type":"content_block_delta",'
                    f'"index":{index},"delta":{{"type":"{kind}_delta","{kind}":')
            cached = self._delta_head = (state, index, head)
        return (cached[2] + encode_basestring_ascii(text) + "}}\n\n").encode("ascii")


def _block_stop(index: int) -> bytes:
    return encode_event("content_block_stop", {"type": "content_block_stop", "index": index})


def _slices(text: str) -> Iterator[str]:
    for start in range(0, len(text), ARGUMENT_SLICE):
        yield text[start : start + ARGUMENT_SLICE]
