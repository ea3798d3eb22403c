"""Re-plan a simulator attempt in process to find its first broken frame (the early-abort probe).

The simulator is deterministic: an attempt's turn depends on (seed, sha256 of ``messages``, attempt
number) and not on the scenario text, so the same attempt planned with ``corrupt=0`` is the clean
version of the same stream. The first piece where the two differ is the first broken frame.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from proxy.simulator.cases import CaseLibrary, default_cases_dir
from proxy.simulator.planner import PlanContext, plan
from proxy.simulator.scenario import parse_scenario
from proxy.simulator.server import make_config

_CONFIG = make_config()
_LIBRARY = CaseLibrary(default_cases_dir())


def _pieces(body: dict[str, Any], scenario_text: str, attempt: int) -> list[bytes]:
    scenario = parse_scenario(scenario_text)
    assert scenario is not None, scenario_text
    canonical = json.dumps(body.get("messages"), sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return plan(PlanContext(body, scenario, attempt, digest, _CONFIG, _LIBRARY)).pieces


def broken_piece(record: dict[str, Any]) -> int | None:
    """Index of the first piece of a corrupted attempt (a ``/_sim/stats`` record) that differs from the
    clean plan of the same attempt; None when they do not differ."""
    scenario = record["scenario"]
    parts = [p for p in scenario.split(":") if not p.startswith(("broken=", "corrupt=", "kinds="))]
    broken = _pieces(record["body"], scenario, record["attempt"])
    clean = _pieces(record["body"], ":".join([*parts, "corrupt=0"]), record["attempt"])
    for index, (a, b) in enumerate(zip(broken, clean, strict=False)):
        if a != b:
            return index
    return None
