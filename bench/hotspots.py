"""Profile one toolrelay Daphne process under load (``pip install -e '.[bench]'``: py-spy, pyinstrument).

``.venv/bin/python bench/hotspots.py [--scenario pass-through|guarded|guarded-4k|paced] [--seconds 20]
[--profiler py-spy|pyinstrument]``

Starts the benchmark stack with one toolrelay process (no LiteLLM) and drives it at concurrency 8
with the load generator. ``py-spy`` samples every thread of the Daphne process from outside and
this script prints the functions with the most busy samples (self and inclusive); the raw
collapsed stacks (for flame graphs) stay next to the logs. On this box py-spy often gets few
samples from a busy process; ``pyinstrument`` (the default) runs inside Daphne
(``bench/profiled_daphne.py``), samples the event loop thread, where the byte path runs, and
prints its call tree.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Stack  # noqa: E402
from bench.run import FAST, GET_WEATHER, GSMALL, PT, WRITE_FILE, body, loadgen  # noqa: E402

#: Leaf frames that are waits: the event loop's select, psycopg waiting for Postgres, thread pools idle.
_IDLE = ("EpollSelector.select", "Connection.wait (psycopg", "_worker (concurrent", "Condition.wait", "Event.wait")
SCENARIOS = {"pass-through": (FAST, None), "guarded": (GSMALL, GET_WEATHER), "guarded-4k": (GSMALL, WRITE_FILE),
             "paced": (PT, None)}


def summarise(raw: Path, top: int) -> str:
    """Top functions by self and inclusive samples from py-spy's collapsed-stack output."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        if any(idle in frames[-1] for idle in _IDLE):
            continue  # waiting, not working (py-spy's own idle detection misses these)
        own[frames[-1]] += n
        total += n
        for frame in set(frames):
            incl[frame] += n
    lines = [f"{total} busy samples", "", "self:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines += ["", "inclusive:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top * 2)]
    return "\n".join(lines)


def pyinstrument(args: argparse.Namespace) -> None:
    """Serve toolrelay from ``bench/profiled_daphne.py`` and print pyinstrument's report after the load."""
    import bench.harness as harness

    scenario, tools = SCENARIOS[args.scenario]
    original = harness.Stack._servers

    def profiled(stack: Stack, name: str, env: dict[str, str], argv: Any) -> harness.Server:
        if name != args.server:
            return original(stack, name, env, argv)
        port = harness.free_port()
        report = stack.log_dir / f"pyinstrument-{args.scenario}.txt"
        wrapper = str(Path(__file__).parent / "profiled_daphne.py")
        serve = (["serve", "--host", "127.0.0.1", "--port", str(port)] if name == "toolrelay"
                 else ["-b", "127.0.0.1", "-p", str(port), "bench.bare_relay:application"])
        proc = stack._spawn(f"{name}-0", [stack.python, wrapper, str(report), *serve], env)
        return harness.Server(name, [proc], [port])

    harness.Stack._servers = profiled  # type: ignore[method-assign, assignment]
    with Stack(processes=1, litellm=False, litellm_models=[]) as stack:
        endpoints = (stack.toolrelay if args.server == "toolrelay" else stack.bare).endpoints()
        reqs = [{"body": body(scenario, f"p-{i}", tools), "target": 0} for i in range(1_000_000)]
        result = loadgen(endpoints, reqs, concurrency=args.concurrency, deadline=args.seconds)
        done = sum(1 for r in result["records"] if r["status"] == 200)
        report = stack.log_dir / f"pyinstrument-{args.scenario}.txt"
    print(f"{args.scenario}: {done} requests in {result['wall']:.1f} s ({done / result['wall']:.1f}/s)")
    print(report.read_text() if report.exists() else f"no report at {report}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="pass-through")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--server", choices=("toolrelay", "bare"), default="toolrelay",
                        help="the process to profile (pyinstrument and cprofile): toolrelay or the bare relay")
    parser.add_argument("--profiler", choices=("pyinstrument", "cprofile", "py-spy"),
                        default="pyinstrument", help="cprofile: CPU time per function of the event loop thread")
    args = parser.parse_args()
    if args.profiler in ("pyinstrument", "cprofile"):
        os.environ["PROFILER"] = args.profiler
        pyinstrument(args)
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    scenario, tools = SCENARIOS[args.scenario]
    with Stack(processes=1, litellm=False, litellm_models=[]) as stack:
        endpoints = (stack.toolrelay if args.server == "toolrelay" else stack.bare).endpoints()
        warm = [{"body": body(scenario, f"warm-{i}", tools), "target": 0} for i in range(50)]
        loadgen(endpoints, warm, concurrency=4)
        raw = stack.log_dir / f"profile-{args.scenario}.txt"
        recorder = subprocess.Popen([spy, "record", "--format", "raw", "--rate", "200",  # noqa: S603
                                     "--duration", str(int(args.seconds)), "--pid", str(stack.toolrelay.pids[0]),
                                     "--output", str(raw)],
                                    stdout=subprocess.DEVNULL, stderr=(stack.log_dir / "py-spy.log").open("wb"))
        time.sleep(0.5)
        reqs = [{"body": body(scenario, f"p-{i}", tools), "target": 0} for i in range(1_000_000)]
        result = loadgen(endpoints, reqs, concurrency=args.concurrency, deadline=args.seconds - 1)
        code = recorder.wait(timeout=args.seconds + 60)
        if code:
            print(f"py-spy exited with {code}: see {stack.log_dir / 'py-spy.log'}")
        done = sum(1 for r in result["records"] if r["status"] == 200)
        print(f"{args.scenario}: {done} requests in {result['wall']:.1f} s ({done / result['wall']:.1f}/s); "
              f"raw stacks in {raw}")
        print(summarise(raw, args.top))


if __name__ == "__main__":
    main()
