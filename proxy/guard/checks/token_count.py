"""A local count of a chat.completions request's prompt tokens, near what the upstream's tokenizer says.

Pure: dicts in, an int out; never raises. ``POST /v1/messages/count_tokens`` answers it, ``message_start``
carries it when the upstream counts late, and a context-window refusal without figures is said with it.

No tokenizer is loaded (the upstream's vocabulary is not here, and a byte-level BPE of 150k entries per
family would cost megabytes per process): the text is split as byte-level BPE pre-tokenizers split it
(GPT-4's and Qwen's patterns, ``\\p{L}+``, ``\\p{N}{1,3}``, punctuation, whitespace runs) and each piece is
priced by what the families' vocabularies make of such pieces: a common word is one token, a long
identifier one more per few letters, a CJK character well under one, digits one per digit in Qwen's
vocabulary and one per three in the others. The prices were fitted and measured against the real
tokenizers that could be had offline (Qwen2.5 / Qwen3.6, DeepSeek V4, OpenAI cl100k; the figures and what
is not verified: docs/clients.md, "count_tokens"; ``scripts/measure_token_count.py`` repeats them).

Each message adds its chat-template framing (role markers, about 4 tokens), each declared tool its JSON
schema as the templates render it, plus a fixed framing for the tool block.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Pre-tokenizer pieces (after GPT-4's / Qwen's pattern): a letter run with one leading space or
#: punctuation mark, a CJK run, 1-3 digits, a punctuation run, a whitespace run.
_PIECE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
                    r"| ?[^\W\d_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
                    r"|\d+| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+")
_ASCII_WORD = re.compile(r" ?[A-Za-z]+")
#: Characters read at most (a request body is bounded before it gets here; this bounds the work).
_CAP = 8_000_000
#: Characters counted piece by piece per request (the rest is priced at the measured rate).
SAMPLE_CHARS = 32_000
#: Characters counted by a family's own tokenizer per request (about 1 ms per 10 KB): for
#: ``count_tokens`` (a worker thread) and for a stream's ``message_start`` (the event loop: about the
#: cost of the estimate's ``SAMPLE_CHARS``).
EXACT_CHARS = 300_000
STREAM_EXACT_CHARS = 128_000
#: Template framing: per message (role markers and separators) and per request.
PER_MESSAGE = 4
PER_REQUEST = 3
#: The tool block's framing (``<tools>`` wrapper and the instructions templates put around it).
PER_TOOLS = 12


#: The feature classes a text is split into (``features``); a family prices each: Han characters, kana,
#: hangul, ASCII words, their extra pieces, digit groups, whitespace runs, punctuation pairs, other
#: letter runs (Cyrillic, Greek, accented) and their letters.
CLASSES = ("han", "kana", "hangul", "word", "long_word", "digits", "space", "punct", "other_word", "other_letter")


@dataclass(frozen=True)
class Family:
    """A tokenizer family's prices: tokens per unit of each class in ``CLASSES`` (fitted by
    ``scripts/measure_token_count.py --fit`` against the family's real tokenizer), and the digits a
    token holds (Qwen splits every digit: 1; cl100k, DeepSeek: 3)."""

    name: str
    weights: tuple[float, ...]
    digit_group: int = 3

    def count_text(self, text: str) -> int:
        """The tokens of ``text`` (never raises; 0 for an empty or non-string ``text``)."""
        return round(sum(w * f for w, f in zip(self.weights, features(text, self.digit_group), strict=True)))


def _cjk(piece: str, out: list[float]) -> None:
    for ch in piece:
        out[1 if ch <= "\u30ff" else 2 if "\uac00" <= ch <= "\ud7af" else 0] += 1


def _add(piece: str, digit_group: int, out: list[float]) -> None:
    """Adds one pre-tokenizer piece to ``out`` (indexed as ``CLASSES``)."""
    first = piece[0]
    if first.isdigit():
        out[5] += -(-len(piece) // digit_group)
    elif "\u3040" <= first <= "\ufaff" or "\uac00" <= first <= "\ud7af":
        _cjk(piece, out)
    elif _ASCII_WORD.fullmatch(piece):
        letters = len(piece.strip())  # a word of up to 7 letters is one token, then one per 6 letters more
        out[3] += 1
        out[4] += 0 if letters <= 7 else (letters - 7 + 5) // 6
    elif not piece.strip():  # a whitespace run (indentation, blank lines) is mostly one token
        out[6] += 1.0 if len(piece) <= 16 else 1.0 + len(piece) / 16
    elif any(ch.isalpha() for ch in piece):  # letters outside ASCII and CJK
        out[8] += 1
        out[9] += len(piece.strip())
    else:
        out[7] += max(1.0, len(piece.strip()) / 2)  # punctuation runs merge in twos (``":``, ``"},``)


def features(text: str, digit_group: int = 3) -> list[float]:
    """``text`` split by the pre-tokenizer pattern, summed per class of ``CLASSES`` (CJK characters,
    ASCII words, their extra pieces, digit groups, whitespace runs, punctuation pairs, other letters)."""
    out = [0.0] * len(CLASSES)
    if isinstance(text, str) and text:
        group = digit_group if digit_group in (1, 2, 3) else 3
        for m in _PIECE.finditer(text[:_CAP]):
            _add(m.group(), group, out)
    return out


#: The families measured (docs/clients.md, "count_tokens"): prices per ``CLASSES`` fitted by
#: ``scripts/measure_token_count.py --fit`` on DeepSeek V4's, Qwen2.5's, Qwen3.6's and cl100k's own
#: tokenizers; ``default`` (every family without a tokenizer here: GLM, Kimi, MiniMax, Llama, Mistral,
#: gpt-4o's o200k) is their mean.
FAMILIES: dict[str, Family] = {
    "deepseek": Family("deepseek", (0.548, 0.588, 0.468, 0.952, 1.211, 1.397, 1.371, 0.878, 0.533, 0.337)),
    "qwen2": Family("qwen2", (0.63, 0.597, 0.547, 1.053, 0.911, 1.403, 1.056, 0.62, 0.522, 0.421), digit_group=1),
    "qwen3": Family("qwen3", (0.554, 0.363, 0.417, 1.032, 0.844, 1.293, 1.103, 0.783, 0.671, 0.281), digit_group=1),
    "cl100k": Family("cl100k", (0.984, 0.98, 0.835, 1.038, 0.8, 1.592, 0.975, 0.682, 0.642, 0.488)),
}
FAMILIES["default"] = Family("default", tuple(round(sum(ws) / 4, 3) for ws in zip(
    *(f.weights for f in FAMILIES.values()), strict=True)))
#: Name markers per family, tried in order (``qwen2`` before ``qwen3``'s catch-all ``qwen``).
_MARKERS: dict[str, tuple[str, ...]] = {
    "deepseek": ("deepseek",),
    "qwen2": ("qwen2", "qwq"),
    "qwen3": ("qwen",),
    "cl100k": ("gpt-4-", "gpt-4", "gpt-3.5"),
}


def family_for(model: object) -> Family:
    """The tokenizer family of a model name (``deepseek-v4-flash`` -> DeepSeek, ``qwen2.5-72b`` ->
    Qwen2.5, ``qwen3-coder`` -> Qwen3, ``gpt-4`` -> cl100k); ``gpt-4o`` and any other name: ``default``."""
    name = model.lower() if isinstance(model, str) else ""
    if "gpt-4o" in name or "gpt-4.1" in name:
        return FAMILIES["default"]
    for key, markers in _MARKERS.items():
        if any(marker in name for marker in markers):
            return FAMILIES[key]
    return FAMILIES["default"]


def count_text(text: str, *, digit_group: int = 3) -> int:
    """The tokens of ``text`` at the default family's prices with ``digit_group`` digits a token."""
    base = FAMILIES["default"]
    return Family(base.name, base.weights, digit_group).count_text(text)


def _texts(value: Any, out: list[str], depth: int = 0) -> None:
    """The strings of a message's content (text parts, tool-call arguments), in order; bounded depth."""
    if depth > 8:
        return
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for item in value:
            _texts(item, out, depth + 1)
    elif isinstance(value, dict):
        for key in ("content", "text", "reasoning_content", "name", "arguments", "function", "tool_calls"):
            if key in value:
                _texts(value[key], out, depth + 1)


class _Sampled:
    """``count`` over the first ``budget`` characters of a request's texts, then the tokens per character
    measured so far for the rest (the estimate's cost stays bounded: about 15 ms for 32k characters)."""

    def __init__(self, count: Callable[[str], int], budget: int) -> None:
        self.count, self.left, self.chars, self.tokens = count, budget, 0, 0

    def __call__(self, text: str) -> int:
        take = max(0, self.left if self.chars else max(self.left, 4096))  # the first text: some always
        head, rest = text[:take], text[take:]
        counted = self.count(head) if head else 0
        self.left -= len(head)
        self.chars, self.tokens = self.chars + len(head), self.tokens + counted
        return counted + (round(len(rest) * self.tokens / self.chars) if rest and self.chars else 0)


def count_request(chat_body: Any, count: Callable[[str], int], *, budget: int = SAMPLE_CHARS) -> int:
    """The prompt tokens of a chat.completions request body (messages and tools), each text counted by
    ``count`` (a family's ``count_text``, or a real tokenizer's ``len(encode(text))``), plus the
    template framing; at least 1 (also for a body that is not a dict). Past ``budget`` characters the
    rest is priced at the tokens per character of what was counted (``_Sampled``)."""
    if not isinstance(chat_body, dict):
        return 1
    sampled = _Sampled(count, budget)
    total = PER_REQUEST
    tools = chat_body.get("tools")
    if isinstance(tools, list) and tools:
        rendered = "\n".join(json.dumps(t, ensure_ascii=False, default=str) for t in tools)
        total += PER_TOOLS + sampled(rendered)
    messages = chat_body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        parts: list[str] = []
        _texts(message, parts)
        total += PER_MESSAGE + sampled("".join(parts))
    return max(1, total)


def count_prompt(chat_body: Any, *, exact: Callable[[str], int | None] | None = None,
                 exact_chars: int = STREAM_EXACT_CHARS) -> int:
    """The prompt tokens of a chat.completions request body for its ``model``'s family (``family_for``).

    ``exact``: the family's own tokenizer, a text -> token count (``None`` for a text it fails on),
    supplied by the caller (``infra.tokenizers.count_prompt`` loads it; the core does no IO): exact on
    the text, about 1 ms per 10 KB, for the first ``exact_chars`` characters, the rest at the measured
    rate. Without one, estimated (``FAMILIES``, about 5-7 ms per 10 KB). Never raises."""
    model = chat_body.get("model") if isinstance(chat_body, dict) else None
    family = family_for(model)
    if exact is None:
        return count_request(chat_body, family.count_text)
    real = exact

    def count(text: str) -> int:
        tokens = real(text)
        return family.count_text(text) if tokens is None else tokens

    return count_request(chat_body, count, budget=exact_chars)
