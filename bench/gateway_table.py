"""Two phases of ``bench/run.py`` that read toolrelay against other people's figures.

- ``gateway_table``: the method of BerriAI's ai-gateway-bench (github.com/BerriAI/ai-gateway-bench,
  README "What it tests" and "Results"): every gateway in front of the same local mock, and the
  figure is ``overhead = latency(client -> gateway -> mock) - latency(client -> mock)``, added p50 and
  p99 at concurrency 1, 4, 16 and 64, for non-streaming requests (time to the whole answer) and
  streaming ones (time to the first token). Here the mock is the simulator, the client is
  ``bench/loadgen.py`` and the gateways are the bare Channels relay, toolrelay and LiteLLM.
- ``paced``: many concurrent paced streams (one frame per 100 ms) held open through toolrelay: no
  frame may arrive more than 10x the pace late and none may fail; RSS per open stream as in the memory
  phase.

Both take the ``Bench`` of the run (``bench.run``); their figures go in ``bench.results``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.harness import rss_bytes

#: Unpaced text (21 frames + [DONE]); the same as the throughput phase.
FAST = "text:20"
#: The paced phase: one text frame per 100 ms.
PACE_MS = 100.0


def _request(scenario: str, tag: str, *, stream: bool) -> dict[str, Any]:
    return {"model": scenario, "stream": stream, "messages": [{"role": "user", "content": f"bench {tag}"}]}


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def gateway_table(bench: Any, *, per_worker: int, window: float) -> None:
    """Latency per gateway, mode and concurrency (``per_worker`` requests per worker, at most ``window``
    seconds each); ``bench.results["gateway_table"][mode][level][name]`` = ``{"p50", "p99", "n", "errors"}``
    in ms, mode ``non-stream`` (request written -> answer complete) or ``stream`` (-> first token)."""
    from bench.run import loadgen, ok

    out: dict[str, dict[int, dict[str, dict[str, float]]]] = {}
    for mode in ("non-stream", "stream"):
        stream = mode == "stream"
        out[mode] = {}
        for level in bench.sizes.levels:
            out[mode][level] = {}
            for name in bench.names:
                reqs = [{"body": _request(FAST, bench.tag(f"gw-{name}"), stream=stream), "target": -1}
                        for _ in range(per_worker * level)]
                result = loadgen(bench.targets[name], reqs, concurrency=level, deadline=window, timeout=30)
                good = ok(result["records"])
                if stream:
                    good = [r for r in good if r["token"] is not None]
                took = [1000 * ((r["token"] if stream else r["end"]) - r["sent"]) for r in good]
                out[mode][level][name] = {"p50": _quantile(took, .5), "p99": _quantile(took, .99), "n": len(good),
                                          "errors": len(result["records"]) - len(good)}
    bench.sim_reset()
    bench.results["gateway_table"] = out


def gateway_rows(results: dict[str, Any]) -> list[str]:
    """The phase's table: added p50 / p99 ms over direct per gateway, mode and concurrency."""
    table = results.get("gateway_table")
    if not table:
        return []
    names = [n for n in ("bare", "toolrelay", "litellm") if any(n in v for lv in table.values() for v in lv.values())]
    head = ["ai-gateway-bench method", "direct p50/p99", *(f"{n} added p50/p99" for n in names), "errors"]
    rows = [head]
    for mode, levels in table.items():
        for level, per in sorted(levels.items(), key=lambda item: int(item[0])):
            direct = per.get("direct", {})
            nan = float("nan")
            cells = [f"{mode} c={level}", f"{direct.get('p50', nan):.2f} / {direct.get('p99', nan):.2f}"]
            for name in names:
                got = per.get(name)
                if got is None:
                    cells.append("-")
                    continue
                cells.append(f"{got['p50'] - direct.get('p50', nan):+.2f} / {got['p99'] - direct.get('p99', nan):+.2f}")
            cells.append(" ".join(f"{n}:{int(per[n]['errors'])}" for n in per if per[n]["errors"]) or "0")
            rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def paced(bench: Any, *, streams: int, seconds: float) -> None:
    """``streams`` concurrent streams of one frame per ``PACE_MS`` for ``seconds``, through toolrelay's
    first process: the worst and p99 gap between frames (ms), errors, and RSS per open stream (KB)."""
    from bench.run import spawn_loadgen

    frames = max(2, int(seconds * 1000 / PACE_MS))
    server = bench.servers["toolrelay"]
    pids, endpoints = [server.pids[0]], [bench.targets["toolrelay"][0]]
    bench.sim_reset()
    base = rss_bytes(pids)
    reqs = [{"body": _request(f"slow:{frames}:frame={PACE_MS:g}", f"paced-{i}", stream=True), "target": -1}
            for i in range(streams)]
    proc = spawn_loadgen(endpoints, reqs, concurrency=streams, deadline=seconds + 60)
    opened = bench._wait_open(streams, timeout=60)
    time.sleep(min(5.0, seconds / 4))
    held = rss_bytes(pids)
    assert proc.stdout is not None
    stdout = proc.stdout.read()  # the job was written and stdin closed by spawn_loadgen
    proc.wait(timeout=seconds + 120)
    if proc.stderr is not None:
        proc.stderr.close()
    records = json.loads(stdout)["records"]
    failed = [r for r in records if r["status"] != 200 or r["end"] is None or r["error"]]
    gaps = [g for r in records for g in r["gaps"]]
    bench.sim_reset()
    bench.results["paced"] = {
        "streams": streams, "opened": opened, "seconds": seconds, "pace_ms": PACE_MS, "errors": len(failed),
        "gap_p99_ms": _quantile(gaps, .99), "gap_max_ms": max(gaps, default=float("nan")),
        "per_stream_kb": (held - base) / max(1, opened) / 1024,
    }


def paced_rows(results: dict[str, Any]) -> list[str]:
    """One line for the paced phase."""
    p = results.get("paced")
    if not p:
        return []
    worst = p["gap_max_ms"] / p["pace_ms"]
    held = "holds" if p["errors"] == 0 and worst <= 10 and p["per_stream_kb"] <= 64 else "FALLS SHORT"
    return [f"paced streams: {p['opened']}/{p['streams']} open, {p['seconds']:.0f} s at one frame per "
            f"{p['pace_ms']:.0f} ms through toolrelay: gap p99 {p['gap_p99_ms']:.1f} ms, max {p['gap_max_ms']:.1f} ms "
            f"({worst:.1f}x the pace; target <= 10x), {p['errors']} error(s), RSS {p['per_stream_kb']:.1f} KB per "
            f"stream (target <= 64): {held}"]
