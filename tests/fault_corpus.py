"""The fault corpus as the tests read it (not a fixture module).

- ``../shared/fault-cases/C*.json`` where that folder sits beside the repository (CI: ``.ci/run`` fails
  without it), read there, never copied;
- always the project's own ``tests/corpus/D*.json`` (same format; ``tests/corpus/pending`` is not loaded).
  It holds a case of every fault kind the shared corpus has: ``D25``-``D59`` each name the shared case
  whose kind they cover in ``mirrors`` (same shape, other values and ids), so a fresh clone with nothing
  beside it still tests every kind.

:func:`case` resolves a shared id (``"C14"``) to the shared fixture, or to the own one mirroring it; the
simulator resolves ``case:C14`` the same way (``proxy.simulator.cases.CaseLibrary``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from proxy.simulator.cases import CaseLibrary

ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = ROOT.parent / "shared" / "fault-cases"
OWN_DIR = ROOT / "tests" / "corpus"
#: Every fixture file the corpus tests run: the shared ones (when present), then the project's own.
PATHS = sorted(SHARED_DIR.glob("C*.json")) + sorted(OWN_DIR.glob("D*.json"))
LIBRARY = CaseLibrary(SHARED_DIR if SHARED_DIR.is_dir() else None, extra=(OWN_DIR,))


def load(path: Path) -> dict[str, Any]:
    """One fixture file as a dict."""
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def case(case_id: str) -> dict[str, Any]:
    """The fixture ``case_id`` (a copy): the shared one, else the project's own that mirrors it."""
    return copy.deepcopy(LIBRARY.get(case_id))
