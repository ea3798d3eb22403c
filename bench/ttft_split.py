"""Where a guarded 4 KB request's text TTFT goes, split at the simulator (one process per server, no LiteLLM).

``.venv/bin/python bench/ttft_split.py [--rounds 15]``

Interleaved rounds at concurrency 1 (as ``bench/run.py``'s guarded phase: ``G4K`` with ``write_file``,
and the pass-through ``PT`` profile) to direct, the bare relay and toolrelay. Every timestamp is
``time.monotonic()`` of the load generator or of the simulator's ``/_sim/stats`` (one clock on one
host), so each request's text TTFT splits into:

- ``to_sim``: client sent -> the simulator has the upstream request (the proxy's work before its call);
- ``sim_fb``: the simulator's own time to its first byte (for ``G4K`` it builds the whole 4 KB call
  first: 9-30 ms of CPU on this box, and slower when anything else takes the CPU meanwhile);
- ``fb_to_token``: the simulator's first byte -> the client's first text token (pacing plus the
  proxy's work on the first frames).

Medians per target and profile are printed (ms). Figures and what they showed: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from the repo root

from bench.harness import Stack, http_get, http_post  # noqa: E402
from bench.run import G4K, PT, SETTLE, WRITE_FILE, body, loadgen  # noqa: E402

PROFILES = (("guarded-4k", G4K, WRITE_FILE), ("pass-through", PT, None))
NAMES = ("direct", "bare", "toolrelay")


def split(record: dict[str, Any], sim: dict[str, Any]) -> dict[str, float]:
    """The parts of one request's text TTFT (ms) from its load-generator ``record`` and simulator record."""
    return {"to_sim": 1000 * (sim["started_monotonic"] - record["sent"]),
            "sim_fb": 1000 * (sim["first_byte_monotonic"] - sim["started_monotonic"]),
            "fb_to_token": 1000 * (record["token"] - sim["first_byte_monotonic"]),
            "ttft": 1000 * (record["token"] - record["sent"])}


def run(rounds: int) -> dict[tuple[str, str], dict[str, list[float]]]:
    """``rounds`` interleaved rounds; the parts of every request by (target, profile)."""
    with Stack(processes=1, litellm=False, litellm_models=[]) as stack:
        targets = {"direct": stack.sim.endpoints(), "bare": stack.bare.endpoints(),
                   "toolrelay": stack.toolrelay.endpoints()}
        endpoints: list[dict[str, Any]] = []
        index: dict[str, int] = {}
        for name in NAMES:
            index[name] = len(endpoints)
            endpoints += targets[name]
        warm = [{"body": body(s, f"warm-{i}", t), "target": index[n]}
                for i in range(6) for n in NAMES[1:] for _, s, t in PROFILES]
        loadgen(endpoints, warm, deadline=120, timeout=60)
        sim_url = f"http://127.0.0.1:{stack.sim.ports[0]}"
        http_post(f"{sim_url}/_sim/reset")
        requests, owner = [], []
        for number in range(rounds):
            for name in NAMES:
                for label, scenario, tools in PROFILES:
                    tag = f"{name}-{label}-{number}"
                    requests.append({"body": body(scenario, tag, tools), "target": index[name], "pause": SETTLE})
                    owner.append((name, label, tag))
        out = loadgen(endpoints, requests, deadline=600, timeout=60)
        stats = json.loads(http_get(f"{sim_url}/_sim/stats", timeout=30))
    by_tag: dict[str, dict[str, Any]] = {}
    for rec in stats["requests"]:
        messages = (rec.get("body") or {}).get("messages") or [{}]
        content = messages[0].get("content", "") if isinstance(messages[0], dict) else ""
        if isinstance(content, str) and content.startswith("bench "):
            by_tag.setdefault(content[6:], rec)
    parts: dict[tuple[str, str], dict[str, list[float]]] = {}
    for record in out["records"]:
        name, label, tag = owner[record["index"]]
        sim = by_tag.get(tag)
        if record.get("token") is None or sim is None or not sim.get("first_byte_monotonic"):
            continue
        for key, value in split(record, sim).items():
            parts.setdefault((name, label), {}).setdefault(key, []).append(value)
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    for (name, label), values in sorted(run(args.rounds).items()):
        line = "  ".join(f"{k} {statistics.median(v):6.2f}" for k, v in values.items())
        print(f"{label:13s} {name:10s} n={len(values['ttft']):3d}  {line}")


if __name__ == "__main__":
    main()
