"""`make test-agents`: the four real coding agents on the simulator's scripted multi-step task.

Installs Claude Code, Codex CLI, OpenCode and Qwen Code from npm into a cache folder (``AGENT_CACHE``,
default ``var/agent-cache``; reused when the binaries are there), starts the simulator and a toolrelay
server on free ports (SQLite, media and secrets in a temp dir), provisions a tenant whose every model
routes to ``task:steps=N:rate=P:seed=S``, and runs each agent headless in a temp dir through toolrelay
and (OpenCode and Qwen Code, which speak chat completions) direct to the simulator. Prints, per agent
and path, the steps completed (``step-*.txt`` files written), the exit status and the seconds.
One agent at a time; every run has a timeout. Not part of `make test` (it needs npm and minutes).

``--budget-spent`` sets the tenant's retry budget to nothing (retry_budget_percent 0 and
``RETRY_BUDGET_MIN_RETRIES=0``) and, unless ``--kinds`` says otherwise, corrupts only with faults that
need a retry (``BROKEN_KINDS``: a fault toolrelay repairs in place needs no budget); ``--broken`` makes
every tool-turn attempt broken beyond repair. Exit status: 0 when every proxy run completed every step
(with ``--budget-spent`` / ``--broken``: when every run the simulator corrupted exited non-zero and
every run it left alone completed; at a 30% rate a run may meet no fault), else 1.
``--parallel N`` runs N copies of each agent's task at once
through toolrelay from the one key (independent conversations with the same opening).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
PACKAGES = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "opencode": "opencode-ai",
    "qwen": "@qwen-code/qwen-code",
}
#: Agents that speak chat completions, so they can also talk to the simulator directly.
CHAT_AGENTS = ("opencode", "qwen")
BROKEN_KINDS = "truncated-arguments-length,mid-stream-error-chunk,undeclared-or-prefixed-tool-name/invented"
PROMPT = (
    "Do the task the way the assistant asks: run each shell command it proposes with your shell tool, "
    "one at a time, until it says done."
)


@dataclass
class Result:
    """One agent run: ``steps`` files written of ``of``, the exit status (124: timed out), seconds,
    the simulator requests it made and how many of them were corrupted."""

    agent: str
    path: str
    steps: int
    of: int
    exit: int
    seconds: float
    requests: int
    corrupted: int


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def agent_bin(cache: Path, name: str) -> Path:
    """The installed binary of agent ``name`` in the npm cache folder."""
    return cache / "node_modules" / ".bin" / name


def install(cache: Path) -> None:
    """``npm install`` the agents missing from ``cache``."""
    missing = [pkg for name, pkg in PACKAGES.items() if not agent_bin(cache, name).exists()]
    if not missing:
        return
    if shutil.which("npm") is None:
        raise SystemExit("test-agents needs npm (Node.js 20+) to install the agents")
    cache.mkdir(parents=True, exist_ok=True)
    print(f"Installing {' '.join(missing)} into {cache}", flush=True)
    subprocess.run(["npm", "install", "--prefix", str(cache), "--no-audit", "--no-fund", *missing], check=True)  # noqa: S603, S607


def wait_http(url: str, process: subprocess.Popen[bytes], what: str, seconds: float = 60) -> None:
    """Return once ``url`` answers (any status); SystemExit when ``process`` dies or time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.3)
    raise SystemExit(f"{what} did not answer within {seconds:g} s")


class Stack:
    """The simulator and a toolrelay server with one provisioned tenant, in ``tmp``."""

    def __init__(self, tmp: Path, model: str, *, budget_spent: bool) -> None:
        self.tmp, self.model = tmp, model
        self.sim_port, self.port = free_port(), free_port()
        drop = {
            "DATABASE_URL",
            "REDIS_URL",
            "CELERY_BROKER_URL",
            "PROMETHEUS_MULTIPROC_DIR",
            "SITE_URL",
            "PORT",
            "SIMULATOR_PORT",
            "UPSTREAM_URL",
        }
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env |= {
            "TOOLRELAY_VAR_DIR": str(tmp / "var"),
            "DEBUG": "1",
            "LOG_LEVEL": "WARNING",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "CREDENTIAL_KEYS": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "UPSTREAM_ALLOW_NETWORKS": "127.0.0.1/32",
            "SITE_URL": f"http://127.0.0.1:{self.port}",
            "DJANGO_SETTINGS_MODULE": "config.settings",
        }
        if budget_spent:
            env["RETRY_BUDGET_MIN_RETRIES"] = "0"
        self.env, self.budget_spent = env, budget_spent
        self.children: list[subprocess.Popen[bytes]] = []
        self.key = ""

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def sim(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    def _manage(self, *args: str) -> str:
        done = subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True)  # noqa: S603
        if done.returncode:
            raise SystemExit(f"manage.py {args[0]} failed:\n{done.stderr[-2000:]}")
        return done.stdout

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("wb")
        process = subprocess.Popen(  # noqa: S603
            [PY, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.children.append(process)
        return process

    def start(self) -> None:
        """Migrate, provision, start both servers."""
        (self.tmp / "var").mkdir(parents=True, exist_ok=True)
        self._manage("migrate", "--no-input", "-v", "0")
        out = self._manage(
            "provision",
            "--tenant",
            "agents",
            "--upstream-url",
            f"{self.sim}/v1",
            "--upstream-key",
            "sim-key",
            "--route",
            f"*={self.model}",
            "--json",
        )
        self.key = json.loads(out)["api_key"]
        if self.budget_spent:
            code = (
                "from tenants.models import Tenant; Tenant.objects.filter(name='agents').update(retry_budget_percent=0)"
            )
            self._manage("shell", "-c", code)
        sim = self._spawn("simulator", "simulate_upstream", "--port", str(self.sim_port))
        wait_http(f"{self.sim}/_sim/stats", sim, "the simulator")
        server = self._spawn("toolrelay", "serve", "--host", "127.0.0.1", "--port", str(self.port))
        wait_http(f"{self.proxy}/healthz", server, "toolrelay")

    def reset(self) -> None:
        """Forget the simulator's attempt counters and records (each run starts alike)."""
        httpx.post(f"{self.sim}/_sim/reset", timeout=5)

    def requests(self) -> tuple[int, int]:
        """Completion requests the simulator saw since the last reset, and how many it corrupted."""
        records = [
            r for r in httpx.get(f"{self.sim}/_sim/stats", timeout=5).json().get("requests", []) if r.get("mode")
        ]
        return len(records), sum(1 for r in records if r.get("fault"))

    def save_records(self, name: str) -> None:
        """The simulator's records of the last run (counter key, attempt, fault) to ``name`` in the temp dir."""
        records = httpx.get(f"{self.sim}/_sim/stats", timeout=5).json().get("requests", [])
        keep = ("counter_key", "attempt", "fault", "status", "stream")
        (self.tmp / name).write_text(
            "".join(json.dumps({k: r.get(k) for k in keep}) + "\n" for r in records if r.get("mode"))
        )

    def stop(self) -> None:
        for process in self.children:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.children:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def command(agent: str, cache: Path, work: Path, base: str, key: str, model: str) -> tuple[list[str], dict[str, str]]:
    """The headless invocation of ``agent`` against ``base`` (no ``/v1``) and its extra environment."""
    binary = str(agent_bin(cache, agent))
    if agent == "claude":
        env = {
            "IS_SANDBOX": "1",
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": key,
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        return [binary, "-p", PROMPT, "--allowedTools", "Bash", "--output-format", "json", "--model", model], env
    if agent == "codex":
        home = work.parent / f"{work.name}-codex-home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            f'model = "{model}"\nmodel_provider = "tr"\n[model_providers.tr]\nname = "toolrelay"\n'
            f'base_url = "{base}/v1"\nenv_key = "TR_KEY"\nwire_api = "responses"\n'
        )
        argv = [binary, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json", PROMPT]
        return argv, {"CODEX_HOME": str(home), "TR_KEY": key}
    if agent == "opencode":
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "name": "toolrelay",
            "options": {"baseURL": f"{base}/v1", "apiKey": key},
            "models": {model: {"name": "m"}},
        }
        config = {
            "provider": {"tr": provider},
            "model": f"tr/{model}",
            "permission": {"bash": "allow", "edit": "allow"},
            "autoupdate": False,
        }
        (work / "opencode.json").write_text(json.dumps(config))
        return [binary, "run", "-m", f"tr/{model}", PROMPT], {"OPENCODE_CONFIG": str(work / "opencode.json")}
    env = {"OPENAI_API_KEY": key, "OPENAI_BASE_URL": f"{base}/v1", "OPENAI_MODEL": model}
    return [binary, "--auth-type", "openai", "--yolo", "-p", PROMPT], env


def _launch(agent: str, path: str, stack: Stack, cache: Path, tag: str = "") -> tuple[subprocess.Popen[bytes], Path]:
    """Starts one headless run of ``agent`` in a fresh work dir (``{agent}-{path}{tag}``)."""
    work = stack.tmp / f"{agent}-{path}{tag}"
    work.mkdir()
    if path == "proxy":
        base, key, model = stack.proxy, stack.key, {"claude": "claude-sonnet-4-5", "codex": "gpt-5"}.get(agent, "m")
    else:
        base, key, model = stack.sim, "sim-key", stack.model
    argv, extra = command(agent, cache, work, base, key, model)
    with (stack.tmp / f"{work.name}.out").open("wb") as out:
        process = subprocess.Popen(  # noqa: S603
            argv,
            cwd=work,
            env={**os.environ, "PWD": str(work), **extra},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return process, work


def _wait(process: subprocess.Popen[bytes], deadline: float) -> int:
    """The exit status, or 124 after killing the process group at ``deadline`` (monotonic seconds)."""
    try:
        return process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 124


def _steps(work: Path, steps: int) -> int:
    return sum(1 for n in range(1, steps + 1) if (work / f"step-{n}.txt").is_file())


def run_agent(agent: str, path: str, stack: Stack, cache: Path, steps: int, timeout: float) -> Result:
    """One headless run in a fresh temp dir; the process group is killed at ``timeout`` seconds."""
    stack.reset()
    started = time.monotonic()
    process, work = _launch(agent, path, stack, cache)
    status = _wait(process, started + timeout)
    seconds = time.monotonic() - started
    stack.save_records(f"{agent}-{path}.records.jsonl")
    return Result(agent, path, _steps(work, steps), steps, status, round(seconds, 1), *stack.requests())


def run_parallel(agent: str, stack: Stack, cache: Path, steps: int, timeout: float, n: int) -> list[Result]:
    """``n`` headless runs of the same task through toolrelay at once, from the one key (each its own
    conversation with the same opening); requests and corrupted are the simulator's totals of all ``n``."""
    stack.reset()
    started = time.monotonic()
    runs = [_launch(agent, "proxy", stack, cache, f"-p{i}") for i in range(1, n + 1)]
    statuses = [_wait(process, started + timeout) for process, _work in runs]
    seconds = round(time.monotonic() - started, 1)
    stack.save_records(f"{agent}-parallel.records.jsonl")
    total = stack.requests()
    return [
        Result(agent, f"par{i}", _steps(work, steps), steps, status, seconds, *total)
        for i, ((_p, work), status) in enumerate(zip(runs, statuses, strict=True), start=1)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rate", type=float, default=0.3, help="share of tool-turn attempts corrupted")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default="", help="fault kinds (default: the task's six)")
    parser.add_argument("--agents", default="claude,codex,opencode,qwen")
    parser.add_argument(
        "--paths",
        help="proxy, direct (chat-completions agents only); default both, proxy alone with --budget-spent/--broken",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per agent run")
    parser.add_argument("--budget-spent", action="store_true", help="the tenant's retry budget is nothing")
    parser.add_argument("--broken", action="store_true", help=f"every tool-turn attempt broken ({BROKEN_KINDS})")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, agent output)")
    parser.add_argument(
        "--parallel",
        type=int,
        default=0,
        metavar="N",
        help="instead: N runs of each agent at once through toolrelay from one key",
    )
    args = parser.parse_args(argv)
    failing = args.budget_spent or args.broken
    if args.broken:
        args.rate, args.kinds = 1.0, args.kinds or BROKEN_KINDS
    elif args.budget_spent:
        args.kinds = args.kinds or BROKEN_KINDS
    args.paths = args.paths or ("proxy" if failing else "proxy,direct")
    model = f"task:steps={args.steps}:rate={args.rate:g}:seed={args.seed}" + (
        f":kinds={args.kinds}" if args.kinds else ""
    )
    cache = Path(os.environ.get("AGENT_CACHE") or ROOT / "var" / "agent-cache")
    install(cache)
    agents = [a for a in args.agents.split(",") if a in PACKAGES]
    tmp = Path(tempfile.mkdtemp(prefix="toolrelay-agents-"))
    stack = Stack(tmp, model, budget_spent=args.budget_spent)
    results: list[Result] = []
    try:
        stack.start()
        print(f"{model}: simulator {stack.sim}, toolrelay {stack.proxy}, work in {tmp}", flush=True)
        print(
            f"{'agent':<9} {'path':<7} {'steps':>7} {'exit':>5} {'seconds':>8} {'requests':>9} {'corrupted':>9}",
            flush=True,
        )
        for result in _runs(args, agents, stack, cache):
            results.append(result)
            print(
                f"{result.agent:<9} {result.path:<7} {result.steps:>3}/{result.of:<3} {result.exit:>5} "
                f"{result.seconds:>8} {result.requests:>9} {result.corrupted:>9}",
                flush=True,
            )
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"model": model, "results": [asdict(r) for r in results]}, indent=2))
    return verdict(results, failing=failing)


def _runs(args: argparse.Namespace, agents: list[str], stack: Stack, cache: Path) -> Iterator[Result]:
    """The runs ``args`` ask for, one agent at a time (``--parallel``: N of the same agent at once)."""
    if args.parallel:
        for agent in agents:
            yield from run_parallel(agent, stack, cache, args.steps, args.timeout, args.parallel)
        return
    for path in args.paths.split(","):
        for agent in agents:
            if path != "direct" or agent in CHAT_AGENTS:
                yield run_agent(agent, path, stack, cache, args.steps, args.timeout)


def verdict(results: list[Result], *, failing: bool) -> int:
    """0 when every proxy run completed, else 1. ``failing`` (``--budget-spent``, ``--broken``): 0 when
    every proxy run the simulator corrupted exited non-zero and every one it never corrupted completed
    (whether a run meets a fault is the draw's), else 1."""
    proxied = [r for r in results if r.path == "proxy" or r.path.startswith("par")]

    def completed(r: Result) -> bool:
        return r.steps == r.of and r.exit == 0

    if failing:
        return 0 if proxied and all(r.exit != 0 if r.corrupted else completed(r) for r in proxied) else 1
    return 0 if proxied and all(completed(r) for r in proxied) else 1


if __name__ == "__main__":
    sys.exit(main())
