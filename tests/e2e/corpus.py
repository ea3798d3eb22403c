"""The fault corpus as the end-to-end tests use it (``tests.fault_corpus``: ../shared/fault-cases when
present, and the project's own ``tests/corpus/D*.json``, which covers every kind)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fault_corpus import PATHS as CASES
from tests.fault_corpus import load

#: The product default: 1 + MAX_RETRIES upstream calls before the exhaustion answer.
MAX_RETRIES = 2


def load_case(path: Path) -> dict[str, Any]:
    """One fixture as a dict."""
    return load(path)


def cases_by_action(*actions: str) -> list[Any]:
    """``pytest.param`` per fixture whose ``expected.action`` is one of ``actions``, id = case id."""
    return [pytest.param(load_case(p), id=p.stem) for p in CASES if load_case(p)["expected"]["action"] in actions]


def upstream_calls(simulator: Any, marker: str) -> list[dict[str, Any]]:
    """The simulator's records of the requests whose body carries ``marker``."""
    return [r for r in simulator.stats()["requests"] if marker in json.dumps(r.get("body", {}))]


def expected_calls(case: dict[str, Any]) -> list[tuple[str, Any]]:
    """The case's expected tool calls as (name, parsed arguments)."""
    return [(c["name"], c["arguments"]) for c in case["expected"]["tool_calls"]]


def finding_kinds(db: Any, request_id: str) -> set[str]:
    """The finding kinds the audit holds for ``request_id`` (``db`` = pytest-django's db blocker)."""
    from audit.models import Finding

    with db.unblock():
        return set(Finding.objects.filter(request_id=request_id).values_list("kind", flat=True))
