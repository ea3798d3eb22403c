"""Benchmark stack: the simulator, toolrelay, the bare relay and LiteLLM as separate processes.

Everything listens on 127.0.0.1 (``run.py`` also puts the whole run in a network namespace with
only loopback when it can). toolrelay gets its own SQLite database under a temporary folder, two
provisioned tenants (early abort on and off) and is served by Daphne; Daphne has no worker option,
so "one process per core" is N Daphne processes on N ports, which the load generator uses
round-robin (in production a load balancer or a shared ``--fd`` does the spreading). The bare
Channels relay (``bench/bare_relay.py``) runs the same way. LiteLLM runs from its own virtual
environment (``bench/.venv-litellm``) with ``--num_workers N`` and no database.

Process helpers here also read CPU time and resident memory from ``/proc`` (no psutil).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
LITELLM_VENV = BENCH / ".venv-litellm"
LITELLM_SPEC = "litellm[proxy]==1.108.7"
LITELLM_KEY = "sk-local-test"
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> bytes:
    """GET ``url`` (loopback only) and return the body."""
    assert url.startswith("http://127.0.0.1:"), url
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback URL checked above
        return bytes(response.read())


def http_post(url: str, data: bytes = b"", timeout: float = 5.0) -> bytes:
    """POST ``data`` to ``url`` (loopback only) and return the body."""
    assert url.startswith("http://127.0.0.1:"), url
    request = urllib.request.Request(url, data=data, method="POST")  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return bytes(response.read())


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers (any HTTP status) or raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        try:
            http_get(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up within {timeout:g} s")


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (from ``/proc/*/stat`` parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` and their live descendants (``/proc/<pid>/stat``)."""
    total = 0.0
    for root in pids:
        for pid in descendants(root):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return total


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of ``pids`` and their live descendants (``/proc/<pid>/statm``)."""
    total = 0
    for root in pids:
        for pid in descendants(root):
            try:
                total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
            except OSError:
                continue
    return total


@dataclass
class Server:
    """One benchmarked server: its processes and the endpoints (host, port, path, headers) it serves."""

    name: str
    procs: list[subprocess.Popen[bytes]]
    ports: list[int]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def endpoints(self, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """The load generator's target specs, one per port."""
        return [{"host": "127.0.0.1", "port": port, "path": "/v1/chat/completions",
                 "headers": headers if headers is not None else self.headers} for port in self.ports]


class Stack:
    """Starts and stops every process of a run; ``with Stack(...) as stack:``."""

    def __init__(self, *, processes: int, litellm: bool, litellm_models: list[str], log_dir: Path | None = None,
                 database: str = "auto") -> None:
        self.processes = processes
        self.database = database
        self.use_litellm = litellm
        self.litellm_models = litellm_models
        self.workdir = Path(tempfile.mkdtemp(prefix="toolrelay-bench-"))
        self.log_dir = log_dir or self.workdir
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []
        self.python = sys.executable
        self.sim: Server
        self.toolrelay: Server
        self.bare: Server
        self.litellm: Server | None = None
        self.postgres: Server | None = None
        self.keys: dict[str, str] = {}
        self.database_url = f"sqlite:///{self.workdir / 'bench.sqlite3'}"

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs.append(log)
        proc = subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **(env or {})},  # noqa: S603 - fixed argv
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        """Terminate every process started (their process groups: LiteLLM's workers too), then kill.

        Postgres goes last, with a fast shutdown (SIGINT), once its clients are gone; its data folder is
        removed (the logs stay).
        """
        last = self.postgres.procs[0] if self.postgres is not None else None
        for group in ([p for p in self._procs if p is not last], [last] if last is not None else []):
            for proc in group:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT if proc is last else signal.SIGTERM)
            deadline = time.monotonic() + 10
            for proc in group:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        for log in self._logs:
            log.close()
        shutil.rmtree(self.workdir / "pg", ignore_errors=True)

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- start ---------------------------------------------------------------------------------

    def django_env(self) -> dict[str, str]:
        """A production-like environment: DEBUG off, fresh secrets, SQLite in the work folder."""
        if not hasattr(self, "_env"):
            self._env = {
                "DATABASE_URL": self.database_url, "DEBUG": "0", "LOG_LEVEL": "WARNING",
                "SECRET_KEY": secrets.token_urlsafe(50),
                "CREDENTIAL_KEYS": base64.urlsafe_b64encode(os.urandom(32)).decode(),
                "TOOLRELAY_VAR_DIR": str(self.workdir), "SITE_URL": "http://127.0.0.1:8000",
                "PYTHONDONTWRITEBYTECODE": "1", "UPSTREAM_ALLOW_NETWORKS": "127.0.0.0/8",  # the simulator
            }
        return dict(self._env)

    def start(self) -> None:
        """Start LiteLLM first (it boots slowest), then the simulator, toolrelay and the bare relay."""
        sim_port = free_port()
        sim_url = f"http://127.0.0.1:{sim_port}/v1"
        litellm_proc = self._start_litellm(sim_url) if self.use_litellm else None
        sim = self._spawn("simulator", [self.python, "-m", "proxy.simulator", "--port", str(sim_port),
                                        "--stats-limit", "100000"])
        self.sim = Server("direct", [sim], [sim_port])
        wait_http(f"http://127.0.0.1:{sim_port}/v1/models", proc=sim)
        if self.database == "postgres" or (self.database == "auto" and postgres_available()):
            self._start_postgres()
        self._provision(sim_url)
        self.toolrelay = self._servers("toolrelay", self.django_env(), lambda port: [
            self.python, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)])
        self.toolrelay.headers = {"authorization": f"Bearer {self.keys['abort']}"}
        self.bare = self._daphnes("bare", "bench.bare_relay:application", {"BARE_UPSTREAM": sim_url})
        for server in (self.toolrelay, self.bare):
            for port, proc in zip(server.ports, server.procs, strict=True):
                wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        if litellm_proc is not None:
            wait_http(f"http://127.0.0.1:{self.litellm.ports[0]}/health/liveliness", timeout=180,  # type: ignore[union-attr]
                      proc=litellm_proc)

    def _daphnes(self, name: str, app: str, env: dict[str, str]) -> Server:
        """``self.processes`` plain Daphne processes serving ``app`` (the bare relay)."""
        return self._servers(name, env, lambda port: [self.python, "-m", "daphne", "-b", "127.0.0.1", "-p",
                                                      str(port), app])

    def _servers(self, name: str, env: dict[str, str], argv: Callable[[int], list[str]]) -> Server:
        """``self.processes`` server processes, each started with ``argv(port)`` on a free port
        (toolrelay: its launcher, ``manage.py serve``)."""
        ports = [free_port() for _ in range(self.processes)]
        procs = [self._spawn(f"{name}-{i}", argv(port), env) for i, port in enumerate(ports)]
        return Server(name, procs, ports)

    def _start_postgres(self) -> None:
        """A private Postgres cluster in the work folder (as the ``postgres`` user), like production's audit
        database: persistent connections, one ``bench`` database, default durability settings."""
        data = self.workdir / "pg"
        data.mkdir()
        self.workdir.chmod(0o755)
        shutil.chown(data, "postgres", "postgres")
        as_pg = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
        subprocess.run([*as_pg, "initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",  # noqa: S603
                        "--no-sync"], check=True, capture_output=True)
        port = free_port()
        proc = self._spawn("postgres", [*as_pg, "postgres", "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                                        "-k", str(data), "-c", "max_connections=50", "-c", "shared_buffers=64MB"])
        deadline = time.monotonic() + 30
        while subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(port)],  # noqa: S603, S607
                             check=False).returncode != 0:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the benchmark's Postgres did not start (see postgres.log)")
            time.sleep(0.2)
        subprocess.run(["createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "bench"],  # noqa: S603, S607
                       check=True)
        self.postgres = Server("postgres", [proc], [port])
        self.database_url = f"postgres://postgres@127.0.0.1:{port}/bench"

    @contextlib.contextmanager
    def limits_servers(self) -> Iterator[tuple[Server, dict[str, str]]]:
        """For the limits phase: a private redis-server, toolrelay processes with ``REDIS_URL`` on it, and two
        keys: ``limited`` (a member's key: every limit set on it, its member and its tenant, money budgets
        included, with a price on every model; never reached) and ``free`` (no limits);
        stopped on exit, so the other phases run as before (no Redis)."""
        redis_port = free_port()
        redis = self._spawn("redis", ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"])
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", redis_port)) == 0:
                    break
            if time.monotonic() > deadline or redis.poll() is not None:
                raise RuntimeError("the benchmark's redis-server did not start (see redis.log)")
            time.sleep(0.05)
        env = {**self.django_env(), "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"}
        big = 10**9
        snippet = (
            "import json\n"
            "from django.core.management import call_command\n"
            "from tenants.models import Membership, Tenant\n"
            "from tenants.services import limits_set, member_key_create\n"
            "t = Tenant.objects.get(name='bench')\n"
            "call_command('prices', 'set', '--model', '*', '--input', '1', '--output', '2')\n"
            "call_command('member', 'add', '--tenant', 'bench', '--user', 'bench-member', '--create-user')\n"
            "m = Membership.objects.get(tenant=t, user__username='bench-member')\n"
            f"money = dict(daily_usd={big}, weekly_usd={big}, monthly_usd={big})\n"
            f"limits_set(tenant=t, values=dict(rpm={big}, tpm={big}, concurrency=100000, daily_tokens={big}, "
            f"monthly_tokens={big}, **money))\n"
            f"limits_set(tenant=t, member=m, values=dict(money))\n"
            "k, raw = member_key_create(membership=m, name='bench-limits')\n"
            f"limits_set(tenant=t, key=k, values=dict(rpm={big}, tpm={big}, concurrency=100000, **money))\n"
            "print(json.dumps({'limited': raw}))\n"
        )
        out = subprocess.run([self.python, "manage.py", "shell", "-c", snippet], cwd=ROOT,  # noqa: S603
                             env={**os.environ, **env}, check=True, capture_output=True, text=True)
        keys = {**json.loads(out.stdout.strip().splitlines()[-1]), "free": self.keys["noabort"]}
        server = self._servers("toolrelay-redis", env, lambda port: [
            self.python, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)])
        try:
            for port, proc in zip(server.ports, server.procs, strict=True):
                wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
            yield server, keys
        finally:
            for proc in [*server.procs, redis]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in [*server.procs, redis]:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                self._procs.remove(proc)

    @contextlib.contextmanager
    def tracing_servers(self) -> Iterator[tuple[Server, dict[str, int]]]:
        """For the tracing phase: an OTLP/HTTP sink in this process (answers 200, counts the bytes of each
        ``/v1/traces`` export) and toolrelay processes started as the others, with tracing on at 100%
        sampling into it (``OTEL_TRACES_SAMPLER=always_on``); stopped on exit."""
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        received = {"exports": 0, "bytes": 0}

        class Sink(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                size = int(self.headers.get("content-length") or 0)
                self.rfile.read(size)
                if self.path == "/v1/traces":
                    received["exports"] += 1
                    received["bytes"] += size
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
        threading.Thread(target=sink.serve_forever, daemon=True).start()
        env = {**self.django_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}",
               "OTEL_TRACES_SAMPLER": "always_on", "OTEL_METRICS_EXPORTER": "none", "OTEL_SERVICE_NAME": "bench"}
        server = self._servers("toolrelay-traced", env, lambda port: [
            self.python, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)])
        try:
            for port, proc in zip(server.ports, server.procs, strict=True):
                wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
            yield server, received
        finally:
            for proc in server.procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in server.procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                self._procs.remove(proc)
            sink.shutdown()
            sink.server_close()

    def _provision(self, sim_url: str) -> None:
        """Migrate, then two tenants on the simulator: early abort on (the default) and off."""
        env = {**os.environ, **self.django_env()}
        subprocess.run([self.python, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)  # noqa: S603
        snippet = (
            "import json\n"
            "from tenants.services import provision\n"
            f"a = provision(tenant_name='bench', upstream_url={sim_url!r}, upstream_key='sk-bench')\n"
            f"b = provision(tenant_name='bench-noabort', upstream_url={sim_url!r}, upstream_key='sk-bench')\n"
            "b.tenant.early_abort = False\n"
            "b.tenant.save(update_fields=['early_abort'])\n"
            "print(json.dumps({'abort': a.raw_key, 'noabort': b.raw_key}))\n"
        )
        out = subprocess.run([self.python, "manage.py", "shell", "-c", snippet], cwd=ROOT, env=env,  # noqa: S603
                             check=True, capture_output=True, text=True)
        self.keys = json.loads(out.stdout.strip().splitlines()[-1])

    def _start_litellm(self, sim_url: str) -> subprocess.Popen[bytes]:
        port = free_port()
        config = self.workdir / "litellm.yaml"
        config.write_text(litellm_config(sim_url, self.litellm_models))
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "NO_DOCS": "True",
               "DISABLE_ADMIN_UI": "True", "OPENAI_API_KEY": "sk-fake-upstream"}
        env = {k: v for k, v in {**os.environ, **env}.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
        proc = self._spawn("litellm", [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(config), "--host",
                                       "127.0.0.1", "--port", str(port), "--num_workers", str(self.processes)], env)
        self.litellm = Server("litellm", [proc], [port], {"authorization": f"Bearer {LITELLM_KEY}"})
        return proc


def postgres_available() -> bool:
    """True when a private Postgres can be started here: root, a ``postgres`` user, initdb and setpriv."""
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return os.geteuid() == 0 and all(shutil.which(b) for b in ("initdb", "postgres", "setpriv", "pg_isready"))


def litellm_config(sim_url: str, models: list[str]) -> str:
    """LiteLLM's config: each simulator scenario as a model, no database, no callbacks, no retries."""
    lines = ["model_list:"]
    for model in models:
        lines += [f"  - model_name: {json.dumps(model)}", "    litellm_params:",
                  f"      model: {json.dumps('openai/' + model)}", f"      api_base: {sim_url}",
                  "      api_key: sk-fake-upstream"]
    lines += ["litellm_settings:", "  callbacks: []", "  num_retries: 0", "  request_timeout: 60",
              "  telemetry: false", "general_settings:", f"  master_key: {LITELLM_KEY}"]
    return "\n".join(lines) + "\n"


def ensure_litellm(python: str = sys.executable) -> Path:
    """Create ``bench/.venv-litellm`` with ``litellm[proxy]==1.108.7`` on first use (needs the registry)."""
    binary = LITELLM_VENV / "bin" / "litellm"
    if binary.exists():
        return binary
    print(f"Creating {LITELLM_VENV} with {LITELLM_SPEC} (first run only, about 2 minutes)...", flush=True)
    subprocess.run([python, "-m", "venv", str(LITELLM_VENV)], check=True)  # noqa: S603
    subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",  # noqa: S603
                    LITELLM_SPEC], check=True)
    return binary
