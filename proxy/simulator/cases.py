"""Fault-case fixtures (``fault-cases/CNN.json``, format in that folder's README) as upstream answers."""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.simulator.turns import Turn, declared_tools, finish, make_call, new_call, new_turn

_REPO = Path(__file__).resolve().parents[2]
#: Where the corpus is looked for when no directory is given (first that exists).
DEFAULT_CASE_DIRS = (_REPO / "tests" / "fixtures" / "fault-cases", _REPO.parent / "shared" / "fault-cases")
#: The project's own corpus (``D*.json``, same format), served next to the shared one.
OWN_CASES_DIR = _REPO / "tests" / "corpus"
_CASE_ID = re.compile(r"^[A-Z]\d{2,3}$")
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def default_cases_dir() -> Path | None:
    """``$TOOLRELAY_FAULT_CASES`` if set, else the first existing of :data:`DEFAULT_CASE_DIRS`."""
    env = os.environ.get("TOOLRELAY_FAULT_CASES")
    if env:
        return Path(env)
    return next((d for d in DEFAULT_CASE_DIRS if d.is_dir()), None)


class CaseNotFound(LookupError):
    """No fixture with that id in the cases directory."""


@dataclass(frozen=True)
class BrokenAnswer:
    """The recorded upstream answer: an SSE body in event-sized pieces, or a plain HTTP answer."""

    status: int
    content_type: str
    pieces: tuple[bytes, ...]
    streamed: bool


class CaseLibrary:
    """Loads fixtures by id on first use and keeps them (the files are small and read-only).

    ``directory`` holds the shared corpus (``C*.json``); ``extra`` directories (the project's own
    ``tests/corpus`` by default) are searched after it for other ids. An id found nowhere resolves to
    the project's own fixture that ``mirrors`` it (same fault kind, other values), so ``case:C14``
    still works in a clone without the shared corpus beside it.
    """

    def __init__(self, directory: Path | None, extra: tuple[Path, ...] = (OWN_CASES_DIR,)) -> None:
        self.directory = directory
        self.dirs = tuple(d for d in (directory, *extra) if d is not None)
        self._cache: dict[str, dict[str, Any]] = {}
        self._mirror_paths: dict[str, Path] | None = None

    def ids(self) -> list[str]:
        """The case ids served, sorted: those present in the directories and those their fixtures mirror."""
        found = {p.stem for d in self.dirs if d.is_dir() for p in d.glob("*.json") if _CASE_ID.match(p.stem)}
        return sorted(found | set(self._mirrors()))

    def get(self, case_id: str) -> dict[str, Any]:
        """The parsed fixture ``case_id`` (case-insensitive, ``c14`` == ``C14``)."""
        key = case_id.strip().upper()
        if key not in self._cache:
            path = next((d / f"{key}.json" for d in self.dirs if (d / f"{key}.json").is_file()), None)
            if path is None and _CASE_ID.match(key):
                path = self._mirrors().get(key)
            if not _CASE_ID.match(key) or path is None:
                raise CaseNotFound(f"no fault case {case_id!r} in {', '.join(map(str, self.dirs)) or 'no directory'}")
            self._cache[key] = json.loads(path.read_text(encoding="utf-8"))
        return self._cache[key]


    def _mirrors(self) -> dict[str, Path]:
        """``{mirrored id: path}`` of the fixtures with a ``mirrors`` field (read once)."""
        if self._mirror_paths is None:
            self._mirror_paths = {}
            paths = [p for d in self.dirs if d.is_dir() for p in sorted(d.glob("*.json")) if _CASE_ID.match(p.stem)]
            for p in paths:
                mirrored = json.loads(p.read_text(encoding="utf-8")).get("mirrors")
                if isinstance(mirrored, str):
                    self._mirror_paths.setdefault(mirrored.upper(), p)
        return self._mirror_paths


def broken_answer(case: dict[str, Any]) -> BrokenAnswer:
    """What the upstream sent: ``upstream_http``, else ``raw_sse`` exactly, else ``data: X\\n\\n``."""
    http = case.get("upstream_http")
    if http:
        body = http["body"] if isinstance(http["body"], str) else json.dumps(http["body"])
        return BrokenAnswer(int(http["status"]), http["content_type"], (body.encode(),), False)
    if case.get("raw_sse") is not None:
        pieces = split_events(case["raw_sse"].encode("utf-8"))
    else:
        pieces = [b"data: " + chunk.encode("utf-8") + b"\n\n" for chunk in case["upstream_chunks"]]
    return BrokenAnswer(200, "text/event-stream; charset=utf-8", tuple(pieces), True)


def split_events(raw: bytes) -> list[bytes]:
    """Cut an SSE body after each blank line (pacing unit); the pieces join back to ``raw``."""
    pieces, start = [], 0
    for match in _EVENT_END.finditer(raw):
        pieces.append(raw[start : match.end()])
        start = match.end()
    if start < len(raw):
        pieces.append(raw[start:])
    return pieces


def clean_turn(case: dict[str, Any], body: dict[str, Any], rng: random.Random) -> Turn:
    """The case's correct turn: ``expected.tool_calls`` and ``expected.content``.

    Retry cases expect no calls (they describe the broken attempt), so their clean turn calls the
    first declared tool with schema-generated arguments.
    """
    expected = case.get("expected") or {}
    turn = new_turn(body, rng)
    calls = expected.get("tool_calls") or []
    turn.calls = [make_call(c["name"], c.get("arguments") or {}, rng, number=i) for i, c in enumerate(calls)]
    tools = declared_tools({"tools": case.get("request_tools")})
    if not turn.calls and tools:
        turn.calls = [new_call(tools[0], rng, number=0)]
    if expected.get("content"):
        turn.content = [w for w in re.split(r"(?<= )", expected["content"]) if w]
    finish(turn, body)
    return turn
