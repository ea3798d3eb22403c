"""The assistant turn the simulator means to send, before it is framed (and possibly corrupted).

A :class:`Turn` is the *intended* answer: text and reasoning pieces, tool calls with their parsed
arguments, a finish reason and usage. Faults (``faults.py``) change how a turn goes on the wire;
``ToolCall.arguments`` keeps the clean value so tests can tell what a correct proxy should deliver.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from proxy.simulator.schemagen import generate_arguments

_WORDS = (
    "the", "parser", "reads", "each", "frame", "and", "checks", "tool", "calls", "before", "it", "emits",
    "a", "clean", "stream", "so", "agents", "never", "see", "broken", "arguments", "retries", "stay",
    "bounded", "while", "text", "flows", "through", "unchanged", "with", "low", "latency",
)  # fmt: skip


@dataclass
class ToolCall:
    """One tool call: ``wire`` is the ``arguments`` value as sent (a JSON string, or an object for
    the ``arguments-as-json-object`` fault); ``fragments`` is how a stream splits a string ``wire``."""

    id: str
    name: str
    arguments: dict[str, Any]
    wire: Any = None
    fragments: list[str] = field(default_factory=list)

    def set_wire(self, text: Any, rng: random.Random) -> None:
        """Send ``text`` as the arguments, split into stream fragments when it is a string."""
        self.wire = text
        self.fragments = split_text(text, rng) if isinstance(text, str) else []


@dataclass
class Turn:
    """An assistant turn; ``http_error`` (status, body) replaces the whole answer when set."""

    completion_id: str
    created: int
    model: str
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: dict[str, Any] = field(default_factory=dict)  # OpenAI usage (details nested)
    http_error: tuple[int, dict[str, Any]] | None = None


@dataclass(frozen=True)
class GenOptions:
    """Knobs of the generated turn (the ``gen`` scenario options)."""

    frames: int | None = None  # text frames; None: 20 without tool calls, 4 as a preamble to calls
    calls: int = 2  # 0: text only, even with tools
    text: bool = True
    reasoning: bool = False
    #: Tool rounds after which the conversation ends with a text answer; None: 1 or 2, drawn per
    #: conversation from ``seed`` and its first user message (see :func:`conversation_over`).
    rounds: int | None = None
    seed: int = 0


def declared_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's function tools as ``{"name", "parameters"}`` dicts (other tool types dropped)."""
    tools = []
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            tools.append({"name": function["name"], "parameters": function.get("parameters") or {}})
    return tools


def split_text(text: str, rng: random.Random, low: int = 3, high: int = 12) -> list[str]:
    """Split ``text`` into pieces of ``low``..``high`` characters, like a tokenizer's output."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + rng.randint(low, high))
        pieces.append(text[start:end])
        start = end
    return pieces


def new_call(tool: dict[str, Any], rng: random.Random, *, number: int) -> ToolCall:
    """A clean call to ``tool`` with schema-generated arguments."""
    arguments = generate_arguments(tool["parameters"], rng)
    return make_call(tool["name"], arguments, rng, number=number)


def make_call(name: str, arguments: dict[str, Any], rng: random.Random, *, number: int) -> ToolCall:
    """A clean call with the given arguments, serialised the way models usually write JSON."""
    call_id = "call_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(20))
    call = ToolCall(id=f"{call_id}{number:02d}", name=name, arguments=arguments)
    call.set_wire(json.dumps(arguments, ensure_ascii=False), rng)
    return call


def text_pieces(count: int, rng: random.Random, size: int = 0) -> list[str]:
    """``count`` short tokens (the first without a leading space), ending in a full stop; with
    ``size``, each token repeated to ``size`` characters (long fast streams in few frames)."""
    words = [rng.choice(_WORDS) for _ in range(count)]
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    if size > 0:
        pieces = [(p * (size // len(p) + 1))[:size] for p in pieces]
    if pieces:
        pieces[-1] += "."
        pieces[0] = pieces[0].capitalize()
    return pieces


def new_turn(body: dict[str, Any], rng: random.Random) -> Turn:
    """An empty turn with identity fields drawn from ``rng`` and the request's model."""
    requested = body.get("model")
    model = requested if isinstance(requested, str) else "sim"
    return Turn(completion_id=f"chatcmpl-{rng.getrandbits(96):024x}", created=int(time.time()), model=model)


def generate_turn(body: dict[str, Any], options: GenOptions, rng: random.Random) -> Turn:
    """A realistic turn for ``body``: tool calls fitting its ``tools`` (text only without tools)."""
    turn = new_turn(body, rng)
    tools = _callable_tools(body)
    if tools and options.calls > 0 and not conversation_over(body, options):
        chosen = _choose_tools(tools, options.calls, rng)
        turn.calls = [new_call(tool, rng, number=i) for i, tool in enumerate(chosen)]
    frames = options.frames if options.frames is not None else (4 if turn.calls else 20)
    if options.reasoning:
        turn.reasoning = text_pieces(max(2, frames // 2), rng)
    if options.text or not turn.calls:
        turn.content = text_pieces(max(1, frames) if not turn.calls else frames, rng)
    finish(turn, body)
    return turn


def text_turn(body: dict[str, Any], frames: int, rng: random.Random, piece_size: int = 0) -> Turn:
    """A tool-less text turn of ``frames`` content pieces (the pass-through profile), each
    ``piece_size`` characters long when given (else one short token)."""
    turn = new_turn(body, rng)
    turn.content = text_pieces(frames, rng, piece_size)
    finish(turn, body)
    return turn


def finish(turn: Turn, body: dict[str, Any]) -> None:
    """Set the finish reason and a plausible usage for a turn whose parts are in place."""
    turn.finish_reason = "tool_calls" if turn.calls else "stop"
    prompt = len(json.dumps(body.get("messages"), default=str)) // 4 + 1
    completion = len(turn.content) + len(turn.reasoning) + sum(len(c.fragments) + 2 for c in turn.calls)
    turn.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def tool_rounds(body: dict[str, Any]) -> int:
    """How many tool rounds ``messages`` already holds: assistant messages with ``tool_calls``
    answered by at least one ``role: "tool"`` message (PROTOCOLS.md 1.5, the agent loop)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    rounds = 0
    for number, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            following = messages[number + 1 : number + 2]
            rounds += bool(following and following[0].get("role") == "tool")
    return rounds


def round_limit(body: dict[str, Any], options: GenOptions) -> int:
    """Tool rounds before the text answer: ``options.rounds``, else 1 or 2 for this conversation.

    The draw depends on the seed and the first user message only, so every turn of one agent
    conversation agrees on it.
    """
    if options.rounds is not None:
        return options.rounds
    first = next((m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"), {})
    text = json.dumps(first.get("content"), sort_keys=True, default=str)
    digest = hashlib.sha256(f"{options.seed}|{text}".encode()).digest()
    return 1 + digest[0] % 2


def conversation_over(body: dict[str, Any], options: GenOptions) -> bool:
    """True when this turn should end the agent's loop with text: the history already has
    :func:`round_limit` tool rounds, and ``tool_choice`` does not demand a call (``"required"`` or a
    named function; a text answer would violate it)."""
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        return False
    return tool_rounds(body) >= round_limit(body, options)


def _callable_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Declared tools the model may call under ``tool_choice`` (none for ``"none"``)."""
    tools, choice = declared_tools(body), body.get("tool_choice")
    if choice == "none":
        return []
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        named = [t for t in tools if t["name"] == wanted]
        return named or tools
    return tools


def _choose_tools(tools: list[dict[str, Any]], count: int, rng: random.Random) -> list[dict[str, Any]]:
    if len(tools) >= count:
        return rng.sample(tools, count)
    return [rng.choice(tools) for _ in range(count)]
