"""toolrelay's benchmark: direct, the bare Channels relay, toolrelay and LiteLLM, side by side in one run.

``make bench`` (full, a few minutes) or ``make bench-quick`` (about two minutes). Run from the
repository root: ``.venv/bin/python bench/run.py [--quick] [--processes N] [--json PATH]``.

Every figure is measured in the same run against the same simulator (``proxy.simulator``) and
printed with its ratio to direct-to-simulator and to LiteLLM 1.108.7. The load generator
(``bench/loadgen.py``) runs in a process of its own; the throughput sweep drives the simulator
directly at the same concurrency levels, which is the harness's own ceiling. Methods are in
``docs/benchmarks.md``; the whole run is put in a fresh network namespace with only loopback
(``unshare -n``) when that is possible, so nothing (LiteLLM included) can reach the network.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from the repo root

from bench.gateway_table import gateway_rows, gateway_table, paced, paced_rows  # noqa: E402
from bench.harness import ROOT, Server, Stack, cpu_seconds, ensure_litellm, http_get, http_post, rss_bytes  # noqa: E402

# ----- profiles --------------------------------------------------------------------------------

#: Pass-through: role chunk, 30 one-token content frames paced 10 ms, finish, [DONE].
PT = "text:30:frame=10"
#: Unpaced streams for throughput and CPU (21 frames + [DONE], as in perf-anchors.md 3.4 B).
FAST = "text:20"
#: Guarded, clean: 8 text frames then one ~4 KB write_file call in ~530 argument deltas, 1 ms apart.
G4K = "gen:calls=1:frames=8:frame=1:corrupt=0"
#: Guarded, small call, unpaced (CPU per guarded request).
GSMALL = "gen:calls=1:frames=8:corrupt=0"
#: Guarded, 20% of attempts corrupted with faults that are provably broken mid-stream.
G20 = "gen:calls=1:frames=8:frame=1:corrupt=0.2:kinds=fused-truncated-sse-frames,mid-stream-error-chunk"
#: Early-abort probe: first attempt broken by a fused, truncated frame (C45) at a random point; 20 ms pacing.
GABORT = "gen:calls=1:frames=8:frame=20:broken=1:kinds=fused-truncated-sse-frames"
ABORT_GAP_MS = 20.0
#: Long paced streams: open-stream memory and disconnects.
SLOW = "slow:60:frame=1000"
DISC = "slow:100:frame=50"
LITELLM_MODELS = [PT, FAST, G4K, GSMALL, SLOW, DISC]
#: Seconds waited before each request of the c=1 rounds, so background work left by the previous
#: request (LiteLLM's logging burns ~0.2 s of CPU after a 4 KB tool call; toolrelay's audit write)
#: does not land in the next measurement on this 2-core box.
SETTLE = 0.1

WRITE_FILE = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "content": {"type": "string", "minLength": 4000}},
                   "required": ["path", "content"]}}}]
GET_WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]


@dataclass(frozen=True)
class Sizes:
    """Request counts and windows of a run."""

    latency_rounds: int
    guarded_rounds: int
    corrupt_rounds: int
    abort_probes: int
    levels: tuple[int, ...]
    window: float
    cpu_batch: int
    open_streams: int
    disconnects: int
    gateway_per_worker: int  # ai-gateway-bench phase: requests per worker at each concurrency
    paced_streams: int  # paced phase: concurrent streams, one frame per 100 ms ...
    paced_seconds: float  # ... for this long


FULL = Sizes(latency_rounds=60, guarded_rounds=16, corrupt_rounds=40, abort_probes=10, levels=(1, 4, 16, 64),
             window=4.0, cpu_batch=300, open_streams=200, disconnects=10, gateway_per_worker=25,
             paced_streams=256, paced_seconds=60.0)
QUICK = Sizes(latency_rounds=10, guarded_rounds=4, corrupt_rounds=5, abort_probes=3, levels=(1, 16),
              window=1.0, cpu_batch=60, open_streams=100, disconnects=4, gateway_per_worker=8,
              paced_streams=64, paced_seconds=15.0)


# ----- small helpers ---------------------------------------------------------------------------

def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank); NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def body(scenario: str, tag: str, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A streamed chat request whose message carries ``tag`` (to find it in the simulator's stats)."""
    data: dict[str, Any] = {"model": scenario, "stream": True,
                            "messages": [{"role": "user", "content": f"bench {tag}"}]}
    if tools:
        data["tools"] = tools
    return data


def loadgen(endpoints: list[dict[str, Any]], requests: list[dict[str, Any]], *, concurrency: int = 1,
            deadline: float = 120, timeout: float = 30) -> dict[str, Any]:
    """Run ``bench/loadgen.py`` in its own process and return its records."""
    job = {"targets": endpoints, "requests": requests, "concurrency": concurrency, "deadline": deadline,
           "timeout": timeout}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "loadgen.py")], input=json.dumps(job).encode(),  # noqa: S603
                         capture_output=True, check=True, timeout=deadline + timeout + 30)
    return dict(json.loads(out.stdout))


def spawn_loadgen(endpoints: list[dict[str, Any]], requests: list[dict[str, Any]], *, concurrency: int,
                  deadline: float) -> subprocess.Popen[bytes]:
    """Start the load generator without waiting (open-stream memory)."""
    job = {"targets": endpoints, "requests": requests, "concurrency": concurrency, "deadline": deadline,
           "timeout": deadline}
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "loadgen.py")], stdin=subprocess.PIPE,  # noqa: S603
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(job).encode())
    proc.stdin.close()
    return proc


def ok(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records of requests that completed with status 200."""
    return [r for r in records if r["status"] == 200 and r["end"] is not None and not r["error"]]


def ms(value: float) -> float:
    return value * 1000


class Bench:
    """The phases of one run; results accumulate in ``self.results``."""

    def __init__(self, stack: Stack, sizes: Sizes) -> None:
        self.stack = stack
        self.sizes = sizes
        self.results: dict[str, Any] = {}
        self.sim_url = f"http://127.0.0.1:{stack.sim.ports[0]}"
        self.targets: dict[str, list[dict[str, Any]]] = {
            "direct": stack.sim.endpoints(),
            "bare": stack.bare.endpoints(),
            "toolrelay": stack.toolrelay.endpoints(),
            "toolrelay-noabort": stack.toolrelay.endpoints({"authorization": f"Bearer {stack.keys['noabort']}"}),
        }
        self.servers: dict[str, Server] = {"direct": stack.sim, "bare": stack.bare, "toolrelay": stack.toolrelay}
        if stack.litellm is not None:
            self.targets["litellm"] = stack.litellm.endpoints()
            self.servers["litellm"] = stack.litellm
        self.run_id = uuid.uuid4().hex[:8]
        self._seq = 0

    def tag(self, label: str) -> str:
        self._seq += 1
        return f"{self.run_id}-{label}-{self._seq}"

    @property
    def names(self) -> list[str]:
        return [n for n in ("direct", "bare", "toolrelay", "litellm") if n in self.targets]

    def sim_records(self) -> dict[str, list[dict[str, Any]]]:
        """Simulator records by the request's tag (all attempts of one client request)."""
        stats = json.loads(http_get(f"{self.sim_url}/_sim/stats", timeout=30))
        by_tag: dict[str, list[dict[str, Any]]] = {}
        for rec in stats["requests"]:
            messages = (rec.get("body") or {}).get("messages") or [{}]
            content = messages[0].get("content", "") if isinstance(messages[0], dict) else ""
            if isinstance(content, str) and content.startswith("bench "):
                by_tag.setdefault(content[6:], []).append(rec)
        return by_tag

    def sim_reset(self) -> None:
        http_post(f"{self.sim_url}/_sim/reset")

    # -- interleaved rounds at concurrency 1 --------------------------------------------------

    def rounds(self, names: list[str], scenario: str, count: int, tools: list[dict[str, Any]] | None = None,
               ) -> dict[str, list[dict[str, Any]]]:
        """``count`` rounds; each sends one request to every target in turn (ports alternate)."""
        endpoints: list[dict[str, Any]] = []
        index: dict[str, list[int]] = {}
        for name in names:
            index[name] = list(range(len(endpoints), len(endpoints) + len(self.targets[name])))
            endpoints += self.targets[name]
        requests, owner = [], []
        for number in range(count):
            for name in names:
                ports = index[name]
                tag = self.tag(name)
                requests.append({"body": body(scenario, tag, tools), "target": ports[number % len(ports)], "tag": tag,
                                 "pause": SETTLE})
                owner.append(name)
        out = loadgen(endpoints, requests, deadline=600, timeout=60)
        by_name: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for rec in out["records"]:
            rec["tag"] = requests[rec["index"]]["tag"]
            by_name[owner[rec["index"]]].append(rec)
        return by_name

    def warm_up(self) -> None:
        """A few requests per endpoint (LiteLLM's first request is slow: imports, tokenizer set-up)."""
        for name in self.names:
            for scenario, tools in ((FAST, None), (GSMALL, GET_WEATHER), (G4K, WRITE_FILE)):
                if name == "direct":
                    continue
                reqs = [{"body": body(scenario, self.tag("warm"), tools), "target": i % len(self.targets[name])}
                        for i in range(4 * len(self.targets[name]))]
                loadgen(self.targets[name], reqs, concurrency=2, deadline=120, timeout=60)
        self.sim_reset()
        self.idle_cpu()

    def idle_cpu(self, seconds: float = 3.0) -> None:
        """CPU each server burns with no request in flight (background loops): noise for everyone else."""
        before = {name: cpu_seconds(server.pids) for name, server in self.servers.items()}
        time.sleep(seconds)
        self.results["idle_cpu_pct"] = {name: 100 * (cpu_seconds(server.pids) - before[name]) / seconds
                                        for name, server in self.servers.items()}

    # -- phases -------------------------------------------------------------------------------

    def latency(self) -> None:
        """Pass-through TTFT and inter-frame gaps at concurrency 1, interleaved rounds."""
        by_name = self.rounds(self.names, PT, self.sizes.latency_rounds)
        out = {}
        for name, recs in by_name.items():
            good = [r for r in ok(recs) if r["token"] is not None]
            ttft = [ms(r["token"] - r["sent"]) for r in good]
            gaps = [g for r in good for g in r["gaps"]]
            out[name] = {"n": len(good), "errors": len(recs) - len(good), "ttft_p50": pct(ttft, .5),
                         "ttft_p99": pct(ttft, .99), "gap_p50": pct(gaps, .5), "gap_p99": pct(gaps, .99),
                         "gaps": len(gaps)}
        self.results["latency"] = out

    def limits(self) -> None:
        """Pass-through TTFT with limits configured (issue 14: the checks add <= 0.3 ms to p50 with Redis on
        loopback): interleaved rounds on the same toolrelay processes (``REDIS_URL`` set, a private
        redis-server), one key with every limit set on it and its tenant (never reached) and one of a tenant
        without limits (no shared-state call); the difference of their p50s is the limits' cost."""
        with self.stack.limits_servers() as (server, keys):
            self.targets["limits-on"] = server.endpoints({"authorization": f"Bearer {keys['limited']}"})
            self.targets["limits-off"] = server.endpoints({"authorization": f"Bearer {keys['free']}"})
            try:
                by_name = self.rounds(["limits-off", "limits-on"], PT, self.sizes.latency_rounds)
            finally:
                del self.targets["limits-on"], self.targets["limits-off"]
        out: dict[str, Any] = {}
        for name, recs in by_name.items():
            good = [r for r in ok(recs) if r["token"] is not None]
            ttft = [ms(r["token"] - r["sent"]) for r in good]
            out[name] = {"n": len(good), "errors": len(recs) - len(good), "ttft_p50": pct(ttft, .5),
                         "ttft_p99": pct(ttft, .99)}
        out["added_p50_ms"] = out["limits-on"]["ttft_p50"] - out["limits-off"]["ttft_p50"]
        self.results["limits"] = out

    def tracing(self) -> None:
        """Tracing on at 100% sampling against off (issue 22: at most +0.3 ms TTFT p50, +10% CPU per request):
        toolrelay processes started as the others but exporting every span to an OTLP sink, in interleaved
        rounds with the untraced ones (pass-through TTFT; a guarded request's trace has more spans and events,
        so its TTFT is measured too), then the CPU batch of a guarded request on each."""
        with self.stack.tracing_servers() as (server, received):
            self.targets["tracing-on"] = server.endpoints(self.stack.toolrelay.headers)
            self.targets["tracing-off"] = self.targets["toolrelay"]
            self.servers["tracing-on"], self.servers["tracing-off"] = server, self.stack.toolrelay
            try:
                out: dict[str, Any] = {}
                for scenario, tools in ((PT, None), (GSMALL, GET_WEATHER)):  # warm up the new processes as the others
                    reqs = [{"body": body(scenario, self.tag("warm"), tools), "target": i % len(server.ports)}
                            for i in range(8 * len(server.ports))]
                    loadgen(self.targets["tracing-on"], reqs, concurrency=2, deadline=120, timeout=60)
                for label, scenario, tools in (("pass-through", PT, None), ("guarded", GSMALL, GET_WEATHER)):
                    by_name = self.rounds(["tracing-off", "tracing-on"], scenario, self.sizes.latency_rounds, tools)
                    for name, recs in by_name.items():
                        good = [r for r in ok(recs) if r["token"] is not None]
                        ttft = [ms(r["token"] - r["sent"]) for r in good]
                        out[f"{label} {name}"] = {"n": len(good), "errors": len(recs) - len(good),
                                                  "ttft_p50": pct(ttft, .5), "ttft_p99": pct(ttft, .99)}
                    out[f"{label} added_p50_ms"] = (out[f"{label} tracing-on"]["ttft_p50"]
                                                    - out[f"{label} tracing-off"]["ttft_p50"])
                for name in ("tracing-off", "tracing-on"):
                    reqs = [{"body": body(GSMALL, f"trace-cpu-{i}", GET_WEATHER), "target": -1}
                            for i in range(self.sizes.cpu_batch)]
                    pids = self.servers[name].pids
                    before = cpu_seconds(pids)
                    result = loadgen(self.targets[name], reqs, concurrency=8, deadline=300, timeout=60)
                    time.sleep(0.3)
                    self._journal_drained(self.servers[name])
                    done = len(ok(result["records"]))
                    out[f"cpu {name}"] = {"n": done, "cpu_ms": 1000 * (cpu_seconds(pids) - before) / max(1, done)}
                off, on = out["cpu tracing-off"]["cpu_ms"], out["cpu tracing-on"]["cpu_ms"]
                out["cpu_added_pct"] = 100 * (on - off) / off if off else float("nan")
                out["exports"], out["export_bytes"] = received["exports"], received["bytes"]
            finally:
                del self.targets["tracing-on"], self.targets["tracing-off"]
                del self.servers["tracing-on"], self.servers["tracing-off"]
        self.sim_reset()
        self.results["tracing"] = out

    def guarded(self) -> None:
        """Clean 4 KB tool call: text TTFT, tail (upstream's last frame -> client's end), total."""
        self.sim_reset()
        by_name = self.rounds(self.names, G4K, self.sizes.guarded_rounds, WRITE_FILE)
        sim = self.sim_records()
        out = {}
        for name, recs in by_name.items():
            good = [r for r in ok(recs) if r["token"] is not None]
            tails = []
            for r in good:
                attempts = [a for a in sim.get(r["tag"], []) if a.get("completed")]
                if attempts:
                    tails.append(ms(r["end"] - max(a["ended_monotonic"] for a in attempts)))
            ttft = [ms(r["token"] - r["sent"]) for r in good]
            total = [ms(r["end"] - r["sent"]) for r in good]
            out[name] = {"n": len(good), "errors": len(recs) - len(good), "ttft_p50": pct(ttft, .5),
                         "ttft_p99": pct(ttft, .99), "tail_p50": pct(tails, .5), "tail_p99": pct(tails, .99),
                         "tail_max": max(tails, default=float("nan")), "total_p50": pct(total, .5),
                         "bytes": statistics.median(r["bytes"] for r in good) if good else 0}
        self.results["guarded"] = out

    def corrupted(self) -> None:
        """20% corrupted attempts: time to the recovered result with early abort on and off, paired.

        Each request goes to direct, toolrelay (abort on) and toolrelay (abort off) with the same
        messages, and the simulator's attempt counters are reset before each, so all three see the
        same draws: the same attempts are broken, by the same fault, at the same frame. The on/off
        difference is then the early abort alone.
        """
        names = ["direct", "toolrelay", "toolrelay-noabort"]
        per: dict[str, list[tuple[dict[str, Any], list[dict[str, Any]]]]] = {n: [] for n in names}
        for number in range(self.sizes.corrupt_rounds):
            tag = self.tag("g20")
            for name in names:
                self.sim_reset()
                request = {"body": body(G20, tag, WRITE_FILE), "target": number % len(self.targets[name]),
                           "pause": SETTLE}
                [record] = loadgen(self.targets[name], [request], deadline=120, timeout=60)["records"]
                per[name].append((record, self.sim_records().get(tag, [])))
        self.sim_reset()
        out = {}
        for name, pairs in per.items():
            good = [(r, a) for r, a in pairs if r["status"] == 200 and r["end"] is not None and not r["error"]]
            total = [ms(r["end"] - r["sent"]) for r, _ in good]
            retried = [ms(r["end"] - r["sent"]) for r, a in good if len(a) > 1]
            broken = [x["bytes_sent"] for _, a in good for x in a if x.get("fault")]
            out[name] = {"n": len(good), "errors": len(pairs) - len(good), "total_p50": pct(total, .5),
                         "total_p99": pct(total, .99), "retried_n": len(retried), "retried_p50": pct(retried, .5),
                         "retried_max": max(retried, default=float("nan")), "faulted_attempts": len(broken),
                         "broken_bytes_read": statistics.mean(broken) if broken else float("nan")}
        self.results["corrupted"] = out
        self.results["early_abort"] = self._abort_probe()

    def _abort_probe(self) -> dict[str, Any]:
        """How soon the upstream read of a broken attempt stops after the first provably broken frame.

        The broken frame's index comes from re-planning the attempt with the simulator's own planner
        (first piece that differs from the clean plan); it was written at ``first_byte + index *
        frame`` (paced writes start on schedule); the upstream read stopped at ``client_closed_at``.
        """
        from bench.simplan import broken_piece

        self.sim_reset()
        reqs = [{"body": body(GABORT, self.tag("abort"), GET_WEATHER), "target": i % 2}
                for i in range(self.sizes.abort_probes)]
        records = loadgen(self.targets["toolrelay"], reqs, deadline=120, timeout=30)["records"]
        sim = self.sim_records()
        lags, unmatched = [], 0
        for rec in sim.values():
            for attempt in rec:
                if not attempt.get("fault") or attempt.get("client_closed_at") is None:
                    continue
                index = broken_piece(attempt)
                if index is None:
                    unmatched += 1
                    continue
                written = attempt["first_byte_monotonic"] + index * ABORT_GAP_MS / 1000
                lags.append(ms(attempt["client_closed_at"] - written))
        return {"n": len(lags), "requests_ok": len(ok(records)), "unmatched": unmatched,
                "p50": pct(lags, .5), "max": max(lags, default=float("nan"))}

    def throughput(self) -> None:
        """Streamed requests per second at rising concurrency (unpaced streams), per target.

        Direct-to-simulator is the harness's ceiling: no proxy figure above it can be read.
        """
        out: dict[str, dict[int, dict[str, float]]] = {}
        for name in self.names:
            out[name] = {}
            for level in self.sizes.levels:
                reqs = [{"body": body(FAST, f"tp-{name}-{level}-{i}")} for i in range(100_000)]
                server = self.servers[name]
                before = cpu_seconds(server.pids)
                result = loadgen(self.targets[name], [dict(r, target=-1) for r in reqs], concurrency=level,
                                 deadline=self.sizes.window, timeout=30)
                time.sleep(0.2)
                cpu = cpu_seconds(server.pids) - before
                done = len(ok(result["records"]))
                out[name][level] = {"rps": done / result["wall"], "n": done,
                                    "errors": len(result["records"]) - done,
                                    "server_cpu_pct": 100 * cpu / result["wall"],
                                    "loadgen_cpu_pct": 100 * result["cpu"] / result["wall"]}
        self.sim_reset()
        self.results["throughput"] = out

    def cpu(self) -> None:
        """CPU seconds per streamed request: a fixed batch at concurrency 8; server CPU before/after."""
        cases: list[tuple[str, str, str, list[dict[str, Any]] | None]] = [
            ("bare", "bare", FAST, None), ("toolrelay", "toolrelay", FAST, None),
            ("toolrelay guarded", "toolrelay", GSMALL, GET_WEATHER),
            ("toolrelay guarded 4 KB", "toolrelay", GSMALL, WRITE_FILE),
        ]
        if "litellm" in self.targets:
            cases += [("litellm", "litellm", FAST, None), ("litellm tools", "litellm", GSMALL, GET_WEATHER),
                      ("litellm tools 4 KB", "litellm", GSMALL, WRITE_FILE)]
        out = {}
        for label, name, scenario, tools in cases:
            batch = self.sizes.cpu_batch // (4 if tools is WRITE_FILE else 1)  # 4 KB calls: ~530 frames each
            reqs = [{"body": body(scenario, f"cpu-{i}", tools), "target": -1} for i in range(batch)]
            server = self.servers[name]
            db = self.stack.postgres.pids if self.stack.postgres is not None and name == "toolrelay" else []
            before, db_before = cpu_seconds(server.pids), cpu_seconds(db)
            result = loadgen(self.targets[name], reqs, concurrency=8, deadline=300, timeout=60)
            time.sleep(0.3)  # background audit writes belong to the request
            if name == "toolrelay":
                self._journal_drained(server)
            cpu, db_cpu = cpu_seconds(server.pids) - before, cpu_seconds(db) - db_before
            done = len(ok(result["records"]))
            out[label] = {"n": done, "cpu_ms": 1000 * cpu / max(1, done), "db_cpu_ms": 1000 * db_cpu / max(1, done),
                          "wall": result["wall"], "errors": len(result["records"]) - done}
        self.sim_reset()
        self.results["cpu"] = out

    def _journal_drained(self, server: Any, timeout: float = 30.0) -> None:
        """Wait until every toolrelay process's audit journal is in the database (its writer's CPU then
        belongs to the batch just measured)."""
        deadline = time.monotonic() + timeout
        for port in server.ports:
            while time.monotonic() < deadline:
                try:
                    state = json.loads(http_get(f"http://127.0.0.1:{port}/readyz"))
                except Exception:  # noqa: BLE001 - an older tree without the journal: nothing to wait for
                    return
                if state.get("journal_backlog_bytes", 0) == 0 or state.get("database") != "ok":
                    break
                time.sleep(0.05)

    def frozen(self) -> None:
        """Latency, CPU and throughput again with the audit database frozen (SIGSTOP of every Postgres
        process): the byte path must not notice. The figures go to ``results["frozen"]``."""
        if self.stack.postgres is None:
            print("  frozen: skipped (no private Postgres)")
            return
        saved = {k: self.results.pop(k, None) for k in ("latency", "cpu", "throughput")}
        pids = _descendants(self.stack.postgres.pids)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # past the in-flight audit batch
            self.latency()
            self.cpu()
            self.throughput()
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        self.results["frozen"] = {k: self.results.pop(k, None) for k in ("latency", "cpu", "throughput")}
        self.results.update({k: v for k, v in saved.items() if v is not None})

    def memory(self) -> None:
        """Resident memory per open stream: RSS with N slow streams open minus RSS before, over N.

        All N streams go to one process that has only served the warm-up (toolrelay pass-through to
        its first process, guarded to its second, the bare relay to its first), so the streams need
        fresh memory rather than reusing what an earlier phase freed. LiteLLM's workers share one port:
        its figure is the sum over its processes.
        """
        cases: list[tuple[str, str, int, list[dict[str, Any]] | None]] = [
            ("bare", "bare", 0, None), ("toolrelay", "toolrelay", 0, None),
            ("toolrelay guarded", "toolrelay", 1 % len(self.targets["toolrelay"]), GET_WEATHER)]
        if "litellm" in self.targets:
            cases.append(("litellm", "litellm", -1, None))
        n = self.sizes.open_streams
        out = {}
        for label, name, port, tools in cases:
            self.sim_reset()
            server = self.servers[name]
            pids = server.pids if port < 0 else [server.pids[port]]
            endpoints = self.targets[name] if port < 0 else [self.targets[name][port]]
            base = rss_bytes(pids)
            reqs = [{"body": body(SLOW, f"mem-{i}", tools), "target": -1} for i in range(n)]
            proc = spawn_loadgen(endpoints, reqs, concurrency=n, deadline=90)
            opened = self._wait_open(n, timeout=60)
            time.sleep(0.5)
            held = rss_bytes(pids)
            proc.terminate()  # the client goes away: every stream is cancelled
            proc.wait(timeout=30)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            time.sleep(1.0)
            out[label] = {"open": opened, "base_mb": base / 2**20, "held_mb": held / 2**20,
                          "per_stream_kb": (held - base) / max(1, opened) / 1024,
                          "after_mb": rss_bytes(pids) / 2**20}
        self.sim_reset()
        self.results["memory"] = out

    def _wait_open(self, n: int, timeout: float) -> int:
        """Wait until the simulator has ``n`` streams open (first byte sent, not ended)."""
        deadline = time.monotonic() + timeout
        opened = 0
        while time.monotonic() < deadline:
            stats = json.loads(http_get(f"{self.sim_url}/_sim/stats", timeout=30))
            opened = sum(1 for r in stats["requests"] if r["first_byte_monotonic"] and not r["ended_monotonic"])
            if opened >= n:
                break
            time.sleep(0.25)
        return opened

    def disconnect(self, include_bare: bool) -> None:
        """Client disconnect -> upstream closed: the client reads 4 bodies of a 50 ms-paced stream, hangs up."""
        self.sim_reset()
        cases: list[tuple[str, str, list[dict[str, Any]] | None]] = [
            ("toolrelay", "toolrelay", None), ("toolrelay guarded", "toolrelay", GET_WEATHER)]
        if "litellm" in self.targets:
            cases.append(("litellm", "litellm", None))
        if include_bare:
            cases.append(("bare", "bare", None))
        endpoints: list[dict[str, Any]] = []
        reqs, owner = [], []
        for label, name, tools in cases:
            first = len(endpoints)
            endpoints += self.targets[name]
            for i in range(self.sizes.disconnects):
                tag = self.tag("disc")
                reqs.append({"body": body(DISC, tag, tools), "target": first + i % len(self.targets[name]),
                             "close_after": 4, "tag": tag})
                owner.append(label)
        records = loadgen(endpoints, reqs, concurrency=len(reqs), deadline=60, timeout=20)["records"]
        deadline = time.monotonic() + 15
        sim = self.sim_records()
        while time.monotonic() < deadline and any(not a["ended_monotonic"] for v in sim.values() for a in v):
            time.sleep(0.5)
            sim = self.sim_records()
        lags: dict[str, list[float]] = {label: [] for label, _, _ in cases}
        for rec in records:
            tag = reqs[rec["index"]]["tag"]
            attempts = sim.get(tag, [])
            if rec["closed"] is None or not attempts:
                continue
            up = attempts[-1]
            closed = up["client_closed_at"] or up["ended_monotonic"]
            lags[owner[rec["index"]]].append(ms(closed - rec["closed"]))
        self.results["disconnect"] = {k: {"n": len(v), "p50": pct(v, .5), "max": max(v, default=float("nan"))}
                                      for k, v in lags.items()}
        self.sim_reset()


# ----- the table ---------------------------------------------------------------------------------

def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:  # NaN
        return "-"
    return f"{value:.{digits}f}"


def _descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them (``/proc/<pid>/task/*/children``)."""
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            todo.extend(int(c) for c in task.read_text().split())
    return out


def _frozen_rows(frozen: dict[str, Any], *, added_fn: Callable[..., float | None]) -> list[tuple[str, ...]]:
    """The frozen phase's headline figures, as table rows (same columns as the main table)."""
    lat, cpu, tp = frozen.get("latency") or {}, frozen.get("cpu") or {}, frozen.get("throughput") or {}
    rows: list[tuple[str, ...]] = []

    def row(label: str, values: dict[str, float | None], target: str = "") -> None:
        tr, ba = values.get("toolrelay"), values.get("bare")
        rows.append((label, fmt(values.get("direct")), fmt(ba), fmt(tr), "", "", "",
                     fmt(None if tr is None or ba is None else tr - ba), target))

    row("database frozen: added TTFT p50 ms", {n: added_fn(lat, n, "ttft_p50") for n in ("bare", "toolrelay")},
        "<= bare+1")
    row("  CPU ms / streamed request", {n: cpu.get(n, {}).get("cpu_ms") for n in ("bare", "toolrelay")},
        "<= 1.3x bare")
    level = tp.get("toolrelay", {}).get("16") or tp.get("toolrelay", {}).get(16)
    bare = tp.get("bare", {}).get("16") or tp.get("bare", {}).get(16)
    row("  streamed req/s at c=16", {"toolrelay": level.get("rps") if level else None,
                                     "bare": bare.get("rps") if bare else None}, ">= 0.8x bare")
    return rows


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a != a or b != b or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def table(results: dict[str, Any]) -> str:
    """One table: figures per target, toolrelay's ratios to direct and to LiteLLM, the target, met or not."""
    rows: list[tuple[str, ...]] = []
    head = ("metric", "direct", "bare relay", "toolrelay", "LiteLLM", "tr/direct", "tr/LiteLLM", "tr-bare", "target")
    lat = results.get("latency", {})

    def added(section: dict[str, Any], name: str, key: str) -> float | None:
        if name not in section or "direct" not in section:
            return None
        return float(section[name][key]) - float(section["direct"][key])

    def add_row(label: str, values: dict[str, float | None], target: str = "", direct_ratio: bool = False,
                digits: int = 2) -> None:
        tr, li, ba, di = (values.get(k) for k in ("toolrelay", "litellm", "bare", "direct"))
        rows.append((label, fmt(di, digits), fmt(ba, digits), fmt(tr, digits), fmt(li, digits),
                     ratio(tr, di) if direct_ratio else "", ratio(tr, li),
                     fmt(None if tr is None or ba is None else tr - ba, digits), target))

    for key, label in (("ttft_p50", "pass-through TTFT p50 ms"), ("ttft_p99", "pass-through TTFT p99 ms")):
        add_row(label, {n: lat.get(n, {}).get(key) for n in ("direct", "bare", "toolrelay", "litellm")},
                direct_ratio=True)
    for key, label, target in (
        ("ttft_p50", "  added TTFT p50 ms", "<= LiteLLM/5, <= bare+1"),
        ("ttft_p99", "  added TTFT p99 ms", ""),
        ("gap_p50", "  added gap p50 ms", ""),
        ("gap_p99", "  added gap p99 ms", "<= bare+0.3"),
    ):
        add_row(label, {n: added(lat, n, key) for n in ("bare", "toolrelay", "litellm")}, target)
    g = results.get("guarded", {})
    add_row("guarded 4 KB: text TTFT p50 ms", {n: g.get(n, {}).get("ttft_p50") for n in g}, direct_ratio=True)
    add_row("  added text TTFT p50 ms", {n: added(g, n, "ttft_p50") for n in ("bare", "toolrelay", "litellm")},
            "<= pass-through+1")
    add_row("  added text TTFT p99 ms", {n: added(g, n, "ttft_p99") for n in ("bare", "toolrelay", "litellm")})
    add_row("  tail p50 ms (last frame->end)", {n: g.get(n, {}).get("tail_p50") for n in g})
    add_row("  tail p99 ms", {n: g.get(n, {}).get("tail_p99") for n in g}, "<= 3")
    add_row("  total p50 ms", {n: g.get(n, {}).get("total_p50") for n in g}, direct_ratio=True)
    c = results.get("corrupted", {})
    if c:
        on, off = c.get("toolrelay", {}), c.get("toolrelay-noabort", {})
        rows.append(("20% corrupted: result p50 ms", fmt(c.get("direct", {}).get("total_p50")), "",
                     f"{fmt(on.get('total_p50'))} / {fmt(off.get('total_p50'))}", "", "", "", "", "abort on / off"))
        rows.append(("  result p99 ms", fmt(c.get("direct", {}).get("total_p99")), "",
                     f"{fmt(on.get('total_p99'))} / {fmt(off.get('total_p99'))}", "", "", "", "", "abort on / off"))
        kb = {k: fmt(v.get("broken_bytes_read", float("nan")) / 1024, 1) for k, v in c.items()}
        rows.append(("  broken attempt: upstream KB read", kb.get("direct", "-"), "",
                     f"{kb.get('toolrelay', '-')} / {kb.get('toolrelay-noabort', '-')}", "", "", "", "",
                     "abort on / off"))
        rows.append(("  retried requests p50 ms", "", "",
                     f"{fmt(on.get('retried_p50'))} / {fmt(off.get('retried_p50'))}", "", "", "", "",
                     f"n={on.get('retried_n')}/{off.get('retried_n')}"))
    ea = results.get("early_abort")
    if ea:
        rows.append(("  early abort: broken frame->read stopped", "", "", f"p50 {fmt(ea['p50'])} max {fmt(ea['max'])}",
                     "", "", "", "", "<= 5 ms"))
    cpu = results.get("cpu", {})
    for label, tr_key, li_key in (("CPU ms / streamed request", "toolrelay", "litellm"),
                                  ("  guarded (small call)", "toolrelay guarded", "litellm tools"),
                                  ("  guarded (4 KB call)", "toolrelay guarded 4 KB", "litellm tools 4 KB")):
        tr = cpu.get(tr_key, {}).get("cpu_ms")
        li = cpu.get(li_key, {}).get("cpu_ms")
        ba = cpu.get("bare", {}).get("cpu_ms") if tr_key == "toolrelay" else None
        rows.append((label, "", fmt(ba), fmt(tr), fmt(li), "", ratio(tr, li),
                     fmt(None if tr is None or ba is None else tr - ba), "<= LiteLLM/10"))
    tp = results.get("throughput", {})
    for level in sorted({lv for v in tp.values() for lv in v}, key=int):
        vals = {n: tp.get(n, {}).get(level, {}).get("rps") for n in ("direct", "bare", "toolrelay", "litellm")}
        add_row(f"streamed req/s at c={level}", vals, "direct = harness ceiling", direct_ratio=True, digits=1)
    mem = results.get("memory", {})
    add_row("RSS KB / open stream", {"bare": mem.get("bare", {}).get("per_stream_kb"),
                                     "toolrelay": mem.get("toolrelay", {}).get("per_stream_kb"),
                                     "litellm": mem.get("litellm", {}).get("per_stream_kb")}, "<= 64", digits=1)
    add_row("  guarded", {"toolrelay": mem.get("toolrelay guarded", {}).get("per_stream_kb")}, "<= 64", digits=1)
    disc = results.get("disconnect", {})
    add_row("disconnect->upstream closed p50 ms", {"bare": disc.get("bare", {}).get("p50"),
                                                   "toolrelay": disc.get("toolrelay", {}).get("p50"),
                                                   "litellm": disc.get("litellm", {}).get("p50")}, "<= 500", digits=1)
    add_row("  max ms", {"bare": disc.get("bare", {}).get("max"), "toolrelay": disc.get("toolrelay", {}).get("max"),
                         "litellm": disc.get("litellm", {}).get("max")}, "<= 500", digits=1)
    add_row("  guarded max ms", {"toolrelay": disc.get("toolrelay guarded", {}).get("max")}, "<= 500", digits=1)
    frozen = results.get("frozen")
    if frozen:
        rows.extend(_frozen_rows(frozen, added_fn=added))
    lim = results.get("limits")
    if lim:
        on, off = lim.get("limits-on", {}), lim.get("limits-off", {})
        both = f"{fmt(on.get('ttft_p50'))} / {fmt(off.get('ttft_p50'))}"
        rows.append(("limits on (Redis): TTFT p50 ms", "", "", both, "", "", "", "", "on / off"))
        rows.append(("  added by the limits p50 ms", "", "", fmt(lim.get("added_p50_ms")), "", "", "", "", "<= 0.3"))
    tr = results.get("tracing")
    if tr:
        for label in ("pass-through", "guarded"):
            both = f"{fmt(tr.get(f'{label} tracing-on', {}).get('ttft_p50'))} / " \
                   f"{fmt(tr.get(f'{label} tracing-off', {}).get('ttft_p50'))}"
            rows.append((f"tracing 100% ({label}): TTFT p50 ms", "", "", both, "", "", "", "", "on / off"))
            rows.append(("  added by tracing p50 ms", "", "", fmt(tr.get(f"{label} added_p50_ms")), "", "", "", "",
                         "<= 0.3"))
        rows.append(("  CPU per guarded request, added %", "", "", fmt(tr.get("cpu_added_pct"), 1), "", "", "", "",
                     "<= 10"))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
             for row in [head, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# ----- the machine -------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    """nproc, CPU model, Python, load average and the versions that matter."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    versions = {}
    from importlib.metadata import PackageNotFoundError, version

    for package in ("Django", "channels", "daphne", "Twisted", "httpx", "httpcore"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "-"
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "loadavg": os.getloadavg(), "versions": versions, "litellm": "1.108.7 (uvicorn 0.54.0)"}


def isolate(argv: list[str]) -> None:
    """Re-run in a fresh network namespace with only loopback up (root, ``unshare`` and ``ip`` needed)."""
    if os.environ.get("TOOLRELAY_BENCH_NETNS") or "--no-netns" in argv:
        return
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        print("note: not isolated in a network namespace (needs root, unshare and ip); loopback only anyway")
        return
    env = {**os.environ, "TOOLRELAY_BENCH_NETNS": "1"}
    script = 'ip link set lo up && exec "$0" "$@"'
    os.execvpe("unshare", ["unshare", "-n", "--", "sh", "-c", script, sys.executable, *argv], env)  # noqa: S606, S607


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts (about two minutes)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                        help="Daphne processes (ports) for toolrelay and the bare relay; LiteLLM workers")
    parser.add_argument("--no-litellm", action="store_true", help="skip LiteLLM")
    parser.add_argument("--no-netns", action="store_true", help="do not isolate the run in a network namespace")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--only", default="", help="comma-separated phases (latency,guarded,corrupted,throughput,"
                                                   "cpu,memory,disconnect,frozen,limits,tracing,"
                                                   "gateway,paced)")
    args = parser.parse_args(argv)
    if not args.no_litellm:
        ensure_litellm()
    isolate(sys.argv)
    sizes = QUICK if args.quick else FULL
    info = machine()
    print(f"machine: {info['nproc']} x {info['cpu']}, Python {info['python']}, load {info['loadavg']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + f", LiteLLM {info['litellm']}")
    started = time.monotonic()
    phases = set(filter(None, args.only.split(","))) or {"latency", "guarded", "corrupted", "throughput", "cpu",
                                                          "memory", "disconnect", "frozen", "limits", "tracing",
                                                          "gateway", "paced"}
    with Stack(processes=args.processes, litellm=not args.no_litellm, litellm_models=LITELLM_MODELS) as stack:
        print(f"stack up in {time.monotonic() - started:.1f} s (logs in {stack.log_dir})", flush=True)
        bench = Bench(stack, sizes)
        bench.warm_up()
        # Memory first: later phases grow the heaps, and freed memory would be reused by the open streams.
        steps: list[tuple[str, Callable[[], None]]] = [
            ("memory", bench.memory), ("latency", bench.latency), ("guarded", bench.guarded),
            ("corrupted", bench.corrupted), ("throughput", bench.throughput), ("cpu", bench.cpu),
            ("disconnect", lambda: bench.disconnect(include_bare=not args.quick)),
            ("frozen", bench.frozen), ("limits", bench.limits), ("tracing", bench.tracing),
            ("gateway", lambda: gateway_table(bench, per_worker=sizes.gateway_per_worker, window=4 * sizes.window)),
            ("paced", lambda: paced(bench, streams=sizes.paced_streams, seconds=sizes.paced_seconds)),
        ]
        for name, step in steps:
            if name in phases:
                t0 = time.monotonic()
                step()
                print(f"  {name}: {time.monotonic() - t0:.1f} s", flush=True)
    info["loadavg_end"] = os.getloadavg()
    print()
    print(table(bench.results))
    for line in [*gateway_rows(bench.results), *paced_rows(bench.results)]:
        print(line)
    idle = bench.results.get("idle_cpu_pct", {})
    print("\nidle CPU % per server (no request in flight): " + ", ".join(f"{k} {v:.1f}" for k, v in idle.items()))
    print(f"load average at start {info['loadavg']}, at end {info['loadavg_end']}; "
          f"wall {time.monotonic() - started:.0f} s; mode {'quick' if args.quick else 'full'}, "
          f"{args.processes} process(es) per server")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": info, "sizes": sizes.__dict__, "results": bench.results},
                                        indent=1, default=str))


if __name__ == "__main__":
    main()
