"""``make test-cluster``: the cluster of ``make cluster`` (scripts/cluster.py) under load, through its faults.

A load of ``--concurrency`` (32) clients through nginx, mixed in equal parts: streamed pass-through,
streamed guarded (a tool declared; the simulator breaks every first attempt, the guard repairs it
or retries) and non-streamed pass-through requests. Each request carries ``User-Agent:
cluster-test/RUN/N`` so its audit row can be found (``ProxyRequest.client_user_agent``). While it runs:

1. **kill**: ``kill -9`` of one serve process. Requests not in flight on it: no error; its in-flight
   requests (sent before the kill, answered by it or not answered at all) may fail, and each that
   reached it has a final audit row once the journal writer drained the dead process's journal. The
   limits and the loop breaker's session state are shared: an rpm probe key and a looping agent's
   session spread over processes (before and after the kill, one on the restarted process) are
   refused and stopped as if served by one process.
2. **rolling**: every serve process SIGTERM'd (it drains), restarted, ready, one by one: 0 failed.
3. **redis**: the cluster's private Redis frozen (SIGSTOP) for 20 s: 0 failed, fail-open answers
   counted (``toolrelay_limits_fail_open_total``), and after it the probes hold again.
4. **postgres**: the private Postgres frozen (SIGSTOP of every backend) for 30 s: 0 failed, and at
   the end every request the proxy answered has its final audit row (0 lost).
5. **per-process**: completed req/s with all serve processes vs with one (the others drained):
   the figure per process at N within 15% of 1.

Prints detail lines, then ``cluster: N/5 hold (...)``; exits 1 unless 5/5. Only the cluster's own
private Redis and Postgres are ever frozen (scripts/cluster.py starts them under var/cluster/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster  # noqa: E402 - scripts/cluster.py, beside this file

TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
KINDS = ("stream", "guarded", "plain")
#: Guarded: every first attempt broken by a fault the guard retries (never the context-length refusal, a
#: genuine client error that the simulator's other kinds may draw).
GUARDED_KINDS = "mid-stream-error-chunk,fused-truncated-sse-frames"
MODELS = {"stream": "gen:corrupt=0:frames=20:frame=10", "plain": "gen:corrupt=0:frames=8",
          "guarded": f"gen:calls=1:broken=1:kinds={GUARDED_KINDS}:frames=4:frame=10"}
LOOP = "gen:loop=1:calls=1:text=0"
STUCK_PREFIX = "[toolrelay] The agent seems stuck"  # proxy.guard.decisions.loops.STUCK_PREFIX


@dataclass
class Rec:
    """One load request: ``sent`` / ``end`` (``time.monotonic()``), ``ok`` once a complete answer arrived."""

    index: int
    kind: str
    sent: float
    end: float | None = None
    status: int = 0
    ok: bool = False
    error: str = ""
    upstream: str = ""
    detail: str = ""
    request_id: str = ""


@dataclass
class Phase:
    """A window of the run (``start`` .. ``stop``, monotonic) and what it found."""

    name: str
    start: float = 0.0
    stop: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)


class Load:
    """``concurrency`` workers sending the mixed requests through nginx until ``stop()``."""

    def __init__(self, base: str, key: str, run: str, concurrency: int) -> None:
        self.base, self.key, self.run, self.concurrency = base, key, run, concurrency
        self.records: list[Rec] = []
        self.running = True

    def body(self, kind: str, index: int) -> dict[str, Any]:
        messages = [{"role": "user", "content": f"Summarize file {index % 97}"}]
        body: dict[str, Any] = {"model": MODELS[kind], "messages": messages, "stream": kind != "plain"}
        if kind == "guarded":
            body["tools"] = [TOOL]
        return body

    async def one(self, client: httpx.AsyncClient, rec: Rec) -> None:
        headers = {"authorization": f"Bearer {self.key}", "user-agent": f"cluster-test/{self.run}/{rec.index}"}
        try:
            async with client.stream("POST", f"{self.base}/chat/completions", json=self.body(rec.kind, rec.index),
                                     headers=headers) as response:
                rec.status = response.status_code
                rec.upstream = response.headers.get("x-toolrelay-upstream", "")
                rec.request_id = response.headers.get("x-request-id", "")  # toolrelay answered (not nginx)
                tail = b""
                async for chunk in response.aiter_raw():
                    tail = (tail + chunk)[-4096:] if rec.kind != "plain" else tail + chunk
                    if b'"error":{' in chunk:
                        rec.error = "error frame"
            if rec.status != 200:
                rec.detail = tail[:300].decode(errors="replace")
            rec.ok = rec.status == 200 and not rec.error and (b"[DONE]" in tail if rec.kind != "plain"
                                                               else b'"choices"' in tail)
            rec.error = rec.error or ("" if rec.ok else f"status {rec.status}")
        except httpx.HTTPError as exc:
            rec.error = f"{type(exc).__name__}: {exc}"[:200]
        rec.end = time.monotonic()

    async def worker(self, client: httpx.AsyncClient) -> None:
        while self.running:
            index = len(self.records)
            rec = Rec(index, KINDS[index % 3], time.monotonic())
            self.records.append(rec)
            await self.one(client, rec)

    async def run_until_stopped(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency * 2, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
            await asyncio.gather(*(self.worker(client) for _ in range(self.concurrency)))

    def completed(self, start: float, stop: float) -> int:
        return sum(1 for r in self.records if r.ok and r.end is not None and start <= r.end < stop)

    def overlapping(self, phase: Phase) -> list[Rec]:
        return [r for r in self.records if r.sent <= phase.stop and (r.end is None or r.end >= phase.start)]


# ----- probes: shared limits and loop state, sent straight to chosen serve processes -----


class Probes:
    """An rpm-limited key and a looping agent's session, each spread over the serve processes."""

    def __init__(self, layout: cluster.Layout, env: dict[str, str], rpm: int, loop_key: str) -> None:
        self.layout, self.rpm, self.loop_key = layout, rpm, loop_key
        made = json.loads(cluster.manage(layout, env, "apikey", "create", "--tenant", cluster.TENANT,
                                         "--name", f"probe-{uuid.uuid4().hex[:8]}", "--json"))
        self.key: str = made["api_key"]
        cluster.manage(layout, env, "limits", "set", "--tenant", cluster.TENANT, "--key", self.key, "--rpm", str(rpm))
        self.session = str(uuid.uuid4())
        self.task = f"Fix the bug [{uuid.uuid4().hex}]"
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": self.task}]
        self.statuses: list[int] = []
        self.turns: list[str] = []

    async def limited(self, port: int) -> None:
        """One request of the probe key to the serve process on ``port``; its status is kept."""
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={
                "authorization": f"Bearer {self.key}"}, json={"model": MODELS["plain"], "messages": [
                    {"role": "user", "content": "hi"}]})
        self.statuses.append(response.status_code)

    async def loop_turn(self, port: int) -> None:
        """One turn of a stateless looping agent (it sends only its last step) on ``port``."""
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", headers={
                "authorization": f"Bearer {self.loop_key}", "x-claude-code-session-id": self.session},
                json={"model": LOOP, "messages": self.messages, "tools": [TOOL]})
        choice = response.json()["choices"][0] if response.status_code == 200 else {}
        message = choice.get("message") or {}
        self.turns.append(choice.get("finish_reason") or f"status {response.status_code}")
        if response.status_code == 400 and STUCK_PREFIX in response.text:  # the tenant's exhaustion: an error
            self.turns[-1] = "stuck"
        calls = message.get("tool_calls") or []
        if calls:
            call = calls[0]
            self.messages = [{"role": "user", "content": self.task},
                             {"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": call["id"], "content": "ENOENT"}]
        elif (message.get("content") or "").startswith(STUCK_PREFIX):
            self.turns[-1] = "stuck"

    def held(self) -> bool:
        """The key was refused once past its rpm, and the fourth identical turn stopped as a loop."""
        limit_ok = self.statuses[: self.rpm] == [200] * self.rpm and self.statuses[self.rpm:] == [429]
        return limit_ok and self.turns == ["tool_calls", "tool_calls", "tool_calls", "stuck"]

    def describe(self) -> str:
        return f"rpm probe {self.statuses}, loop turns {self.turns}"


# ----- the run -----


def ctl(layout: cluster.Layout, *args: str) -> None:
    """``scripts/cluster.py ARGS`` in a process of its own (what it starts is not our child)."""
    subprocess.run([layout.python, str(Path(cluster.__file__)), *args], check=True, cwd=layout.root,  # noqa: S603
                   env={**os.environ, "CLUSTER_PORT": str(layout.port), "CLUSTER_SERVES": str(layout.serves)},
                   stdout=subprocess.DEVNULL)


def serve_proc(layout: cluster.Layout, i: int) -> cluster.Proc:
    return next(p for p in cluster.plan(layout) if p.name == f"serve-{i}")


def fail_open_total(layout: cluster.Layout) -> float:
    """``toolrelay_limits_fail_open_total`` summed over the serve processes' own /metrics."""
    total = 0.0
    for port in layout.serve_ports:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        total += sum(float(m) for m in re.findall(r"^toolrelay_limits_fail_open_total\{[^}]*\} (\S+)$", text, re.M))
    return total


async def kill_phase(layout: cluster.Layout, probes: Probes, phase: Phase, victim: int) -> None:
    """A ``kill -9`` of serve ``victim`` and its restart (``cluster.py start``). A looping agent's session runs
    across it (two turns before on the victim and another process, two after, the last on the restarted
    victim); the rpm probe spreads its key's requests over every process, the restarted one first and last
    (all within a second or two: the limit is a sliding minute, so a count does not outlive a restart)."""
    ports = layout.serve_ports
    others = [p for p in ports if p != ports[victim - 1]] or ports
    for port in (ports[victim - 1], others[0]):
        await probes.loop_turn(port)
    pid = cluster.pid_of(layout, serve_proc(layout, victim))
    phase.start = time.monotonic()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(3)
    await asyncio.to_thread(ctl, layout, "start", f"serve-{victim}")
    await probes.loop_turn(others[-1])
    await probes.loop_turn(ports[victim - 1])
    spread = [ports[victim - 1], *others]
    for i in range(probes.rpm + 1):
        await probes.limited(spread[i % len(spread)] if i < probes.rpm else ports[victim - 1])
    phase.facts["probes"] = probes
    await asyncio.sleep(2)
    phase.stop = time.monotonic()


async def rolling_phase(layout: cluster.Layout, phase: Phase) -> None:
    """SIGTERM each serve process in turn, wait for its drain, start it again and wait until it is ready."""
    phase.start = time.monotonic()
    for i in range(1, layout.serves + 1):
        await asyncio.to_thread(cluster.stop_proc, layout, serve_proc(layout, i))
        await asyncio.to_thread(ctl, layout, "start", f"serve-{i}")
    await asyncio.sleep(2)
    phase.stop = time.monotonic()


async def redis_phase(layout: cluster.Layout, probes: Probes, phase: Phase, seconds: float) -> None:
    """Freeze the private Redis for ``seconds``; after it, fresh probes must hold again."""
    pid = cluster.redis_pid(layout)
    if pid is None:
        raise RuntimeError("the cluster's private Redis is not running")
    before = await asyncio.to_thread(fail_open_total, layout)
    phase.start = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(5)  # the limits' circuit breaker closes (LIMITS_REDIS_COOLDOWN_SECONDS)
    phase.stop = time.monotonic()
    phase.facts["fail_open"] = await asyncio.to_thread(fail_open_total, layout) - before
    ports = layout.serve_ports
    for port in (ports[0], ports[-1], ports[len(ports) // 2]):
        await probes.limited(port)
    for turn in range(4):
        await probes.loop_turn(ports[turn % len(ports)])
    phase.facts["probes"] = probes


async def postgres_phase(layout: cluster.Layout, phase: Phase, seconds: float) -> None:
    """Freeze every process of the private Postgres for ``seconds``."""
    pids = cluster.postgres_pids(layout)
    if not pids:
        raise RuntimeError("the cluster's private Postgres is not running")
    phase.start = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(5)
    phase.stop = time.monotonic()


async def throughput(load: Load, phase: Phase, seconds: float) -> None:
    await asyncio.sleep(2)  # settle after what came before
    phase.start = time.monotonic()
    await asyncio.sleep(seconds)
    phase.stop = time.monotonic()
    phase.facts["rps"] = load.completed(phase.start, phase.stop) / (phase.stop - phase.start)


async def single_phase(layout: cluster.Layout, load: Load, phase: Phase, seconds: float) -> None:
    """Drain every serve process but the first, measure, start them again."""
    for i in range(2, layout.serves + 1):
        await asyncio.to_thread(cluster.stop_proc, layout, serve_proc(layout, i))
    await throughput(load, phase, seconds)
    await asyncio.to_thread(ctl, layout, "start", *(f"serve-{i}" for i in range(2, layout.serves + 1)))


async def scenario(layout: cluster.Layout, env: dict[str, str], load: Load, args: argparse.Namespace) -> list[Phase]:
    phases = {name: Phase(name) for name in ("steady", "kill", "rolling", "redis", "postgres", "single")}
    # The probe keys are made before the load (manage.py under load takes seconds).
    kill_probes, redis_probes = (Probes(layout, env, rpm, env["CLUSTER_TEST_KEY"]) for rpm in (4, 2))
    task = asyncio.create_task(load.run_until_stopped())
    try:
        await asyncio.sleep(3)  # warm-up
        await throughput(load, phases["steady"], args.phase)
        await kill_phase(layout, kill_probes, phases["kill"], victim=min(2, layout.serves))
        await rolling_phase(layout, phases["rolling"])
        await redis_phase(layout, redis_probes, phases["redis"], args.redis_seconds)
        await postgres_phase(layout, phases["postgres"], args.postgres_seconds)
        await single_phase(layout, load, phases["single"], args.phase)
    finally:
        load.running = False
        await task
    return list(phases.values())


# ----- the verdicts -----


def audit_outcomes(layout: cluster.Layout, run: str, wanted: int, timeout: float) -> dict[int, str]:
    """``{request index: outcome}`` of this run's audit rows, once none is pending (or ``timeout`` passed)."""
    query = ("select client_user_agent, outcome from audit_proxyrequest "  # noqa: S608 - run is our own hex
             f"where client_user_agent like 'cluster-test/{run}/%'")
    deadline = time.monotonic() + timeout
    rows: dict[int, str] = {}
    while time.monotonic() < deadline:
        out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(layout.postgres_port), "-U", "postgres",  # noqa: S603, S607
                              "-d", "toolrelay", "-At", "-F", "\t", "-c", query],
                             capture_output=True, text=True, check=False).stdout
        rows = {int(ua.rsplit("/", 1)[1]): outcome for ua, outcome in
                (line.split("\t") for line in out.splitlines() if "\t" in line)}
        if len(rows) >= wanted and "pending" not in rows.values():
            break
        time.sleep(2)
    return rows


def failed(records: list[Rec]) -> list[Rec]:
    return [r for r in records if not r.ok]


def judge_kill(load: Load, phase: Phase, port: int, rows: dict[int, str]) -> tuple[bool, str]:
    """No error outside the victim's in-flight requests; each of those that it answered audited final.

    In flight on the victim: answered by it, or sent to it by nginx (its address in
    ``X-Toolrelay-Upstream``), and not ended before the kill; a request sent up to 1 s after the kill
    signal still counts when nginx reached the victim with it (a killed process's socket closes only
    once the kernel has torn it down).
    """
    victim = f"127.0.0.1:{port}"
    window = load.overlapping(phase)
    in_flight = [r for r in window if r.sent < phase.start + 1.0 and (r.end is None or r.end > phase.start)
                 and (victim in r.upstream or (not r.upstream and r.sent < phase.start))]
    cut = [r for r in in_flight if not r.ok]
    outside = [r for r in failed(window) if r not in in_flight]
    answered = [r for r in cut if r.request_id]
    audited = [r for r in answered if rows.get(r.index, "pending") != "pending"]
    probes: Probes = phase.facts["probes"]
    ok = not outside and len(audited) == len(answered) and probes.held()
    return ok, (f"kill: {len(outside)} errors outside, {len(cut)} cut in flight ({len(audited)}/{len(answered)} "
                f"begun by it audited final, {len(cut) - len(answered)} refused by nginx), {probes.describe()}")


def summarize(layout: cluster.Layout, load: Load, phases: list[Phase], run: str) -> tuple[int, list[str]]:
    by = {p.name: p for p in phases}
    answered = [r for r in load.records if r.request_id]
    rows = audit_outcomes(layout, run, len(answered), timeout=120)
    lost = [r for r in answered if rows.get(r.index, "pending") == "pending"]
    kill_ok, kill_text = judge_kill(load, by["kill"], layout.serve_ports[min(2, layout.serves) - 1], rows)
    roll = load.overlapping(by["rolling"])
    redis = load.overlapping(by["redis"])
    redis_probes: Probes = by["redis"].facts["probes"]
    pg = load.overlapping(by["postgres"])
    rps_n, rps_1 = by["steady"].facts["rps"], by["single"].facts["rps"]
    ratio = rps_n / layout.serves / rps_1 if rps_1 else 0.0
    verdicts = [
        (kill_ok, kill_text),
        (not failed(roll), f"rolling: {len(failed(roll))}/{len(roll)} failed"),
        (not failed(redis) and redis_probes.held() and by["redis"].facts["fail_open"] > 0,
         f"redis: {len(failed(redis))}/{len(redis)} failed, {by['redis'].facts['fail_open']:.0f} fail-open, "
         f"after: {redis_probes.describe()}"),
        (not failed(pg) and not lost, f"postgres: {len(failed(pg))}/{len(pg)} failed, {len(lost)} of "
                                      f"{len(answered)} requests toolrelay answered without a final audit row "
                                      f"{[r.index for r in lost][:5]}"),
        (ratio >= 0.85, f"per-process: {rps_n:.1f} req/s at {layout.serves} = {rps_n / layout.serves:.1f}/process, "
                        f"{rps_1:.1f} at 1; ratio {ratio:.2f}"),
    ]
    return sum(ok for ok, _ in verdicts), [("ok   " if ok else "FAIL ") + text for ok, text in verdicts]


def dump(layout: cluster.Layout, load: Load, phases: list[Phase]) -> None:
    """The phases and the requests that were not ok, to ``var/cluster/test-last.json`` (seconds from the start)."""
    zero = load.records[0].sent if load.records else 0.0
    out = {"phases": [{"name": p.name, "start": p.start - zero, "stop": p.stop - zero} for p in phases],
           "failed": [{**asdict(r), "sent": r.sent - zero, "end": None if r.end is None else r.end - zero}
                      for r in failed(load.records)]}
    layout.path("test-last.json").write_text(json.dumps(out, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description="make test-cluster: the cluster under load through its faults")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--phase", type=float, default=15.0, help="seconds of each req/s measurement")
    parser.add_argument("--redis-seconds", type=float, default=20.0)
    parser.add_argument("--postgres-seconds", type=float, default=30.0)
    args = parser.parse_args()
    layout = cluster.layout_from_env()
    env = {**cluster.cluster_env(layout, cluster.read_secrets(layout)), "PATH": os.environ.get("PATH", "")}
    ctl(layout, "start")
    tenant = json.loads(layout.path("tenant.json").read_text())
    env["CLUSTER_TEST_KEY"] = tenant["api_key"]  # the loop probes' key (no limit of its own)
    run = uuid.uuid4().hex[:10]
    load = Load(tenant["base_url"], tenant["api_key"], run, args.concurrency)
    started = time.monotonic()
    phases = asyncio.run(scenario(layout, env, load, args))
    held, lines = summarize(layout, load, phases, run)
    dump(layout, load, phases)
    for line in lines:
        print(line)
    errors = {r.error for r in failed(load.records)}
    print(f"{len(load.records)} requests in {time.monotonic() - started:.0f} s at c={args.concurrency}, "
          f"{len(failed(load.records))} not ok; kinds of error: {sorted(errors)[:6]}")
    print(f"cluster: {held}/5 hold ({'; '.join(line[5:] for line in lines)})")
    return 0 if held == 5 else 1


if __name__ == "__main__":
    sys.exit(main())
