"""``make cluster``: the deployment of docs/deployment.md on this machine, for real, without containers.

``python scripts/cluster.py start|stop|status`` (``make cluster``, ``make cluster-stop``). What runs:

- a private Postgres and a private Redis (``initdb`` / ``redis-server`` under ``var/cluster/``, never the
  machine's shared servers, so ``make test-cluster`` may freeze them);
- the fault-injecting simulator as the upstream, and a provisioned demo tenant (its key in
  ``var/cluster/tenant.json``, mode 0600);
- the journal writer (``manage.py journal_writer``), one per host, with ``JOURNAL_WRITER=external`` on
- ``CLUSTER_SERVES`` (3) ``manage.py serve`` processes on ``CLUSTER_PORT + 1 ...``;
- the Celery worker and beat (Redis as the broker);
- nginx from the distribution's packages (installed with apt-get when missing, as ``.ci/run`` does for
  Postgres and Redis) on ``CLUSTER_PORT`` (8080): least connections, SSE never buffered.

Everything (configuration, pid files, logs, data) is under ``var/cluster/``. ``start`` is idempotent:
what runs is left alone, what is missing (a killed serve process) is started again, and nginx reloads
its configuration. ``stop`` stops it all, the serve processes with SIGTERM (they drain their streams).
``plan(layout)`` and ``nginx_conf(layout)`` are pure: ``tests/test_cluster_script.py`` reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AS_POSTGRES = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
TENANT = "cluster-demo"
#: Ports relative to CLUSTER_PORT: serve i on +i (1..N), then the simulator, Redis and Postgres.
SIMULATOR_OFFSET, REDIS_OFFSET, POSTGRES_OFFSET = 11, 12, 13


@dataclass(frozen=True)
class Layout:
    """Where the cluster lives: ``root`` (the repository), ``port`` (nginx), ``serves`` processes."""

    root: Path = ROOT
    port: int = 8080
    serves: int = 3
    python: str = str(ROOT / ".venv" / "bin" / "python")

    @property
    def dir(self) -> Path:
        return self.root / "var" / "cluster"

    @property
    def serve_ports(self) -> list[int]:
        return [self.port + i for i in range(1, self.serves + 1)]

    @property
    def simulator_port(self) -> int:
        return self.port + SIMULATOR_OFFSET

    @property
    def redis_port(self) -> int:
        return self.port + REDIS_OFFSET

    @property
    def postgres_port(self) -> int:
        return self.port + POSTGRES_OFFSET

    @property
    def database_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.postgres_port}/toolrelay"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def path(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)


@dataclass(frozen=True)
class Proc:
    """One supervised process: ``argv`` run in the repository with the cluster's environment.

    ``ready``: a URL that answers 200 once it serves (None: running is enough); ``marker``: a string in
    its ``/proc/PID/cmdline`` (NUL-separated) that tells it from a reused pid; ``stop_timeout``: seconds
    between the stop signal and SIGKILL.
    """

    name: str
    argv: list[str]
    marker: str
    ready: str | None = None
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 30.0
    env: dict[str, str] = field(default_factory=dict)


def layout_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> Layout:
    """``CLUSTER_PORT`` (8080) and ``CLUSTER_SERVES`` (3, 1..16) from the environment; bad values raise ValueError."""
    port = int(environ.get("CLUSTER_PORT", "8080"))
    serves = int(environ.get("CLUSTER_SERVES", "3"))
    if not 1024 <= port <= 65535 - 20 or not 1 <= serves <= 16:
        raise ValueError("CLUSTER_PORT must be 1024..65515 and CLUSTER_SERVES 1..16")
    return Layout(port=port, serves=serves)


def _py(layout: Layout, name: str, args: list[str], **kwargs: object) -> Proc:
    argv = [layout.python, *args]
    return Proc(name=name, argv=argv, marker="\0".join(args), **kwargs)  # type: ignore[arg-type]


def plan(layout: Layout) -> list[Proc]:
    """Every supervised process, in start order (``stop`` goes in reverse); Postgres and Redis come first,
    started by ``start`` itself. The serve processes leave the journal to the one writer
    (``JOURNAL_WRITER=external``, docs/deployment.md "The journal writer")."""
    celery = str(Path(layout.python).parent / "celery")
    procs = [
        _py(layout, "simulator", ["manage.py", "simulate_upstream", "--port", str(layout.simulator_port),
                                  "--corruption-rate", "0.2", "--frame-ms", "10"],
            ready=f"http://127.0.0.1:{layout.simulator_port}/_sim/stats"),
        _py(layout, "journal-writer", ["manage.py", "journal_writer"]),
    ]
    for i, port in enumerate(layout.serve_ports, 1):
        procs.append(_py(layout, f"serve-{i}", ["manage.py", "serve", "--host", "127.0.0.1", "--port", str(port),
                                                 "--proxy-headers", "--no-access-log"],
                         ready=f"http://127.0.0.1:{port}/readyz", stop_timeout=40.0,
                         env={"JOURNAL_WRITER": "external"}))
    procs += [
        Proc("celery-worker", [celery, "-A", "config", "worker", "--loglevel=warning", "--concurrency=1",
                               "-n", f"cluster{layout.port}@%h"], marker=f"cluster{layout.port}@"),
        Proc("celery-beat", [celery, "-A", "config", "beat", "--loglevel=warning", "--pidfile=",
                             "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"],
             marker="beat\0--loglevel=warning\0--pidfile="),
        Proc("nginx", ["nginx", "-p", str(layout.path("nginx")), "-c", str(layout.path("nginx.conf"))],
             marker=str(layout.path("nginx.conf")), ready=f"http://127.0.0.1:{layout.port}/healthz",
             stop_signal=signal.SIGQUIT, stop_timeout=10.0),
    ]
    return procs


def nginx_conf(layout: Layout, *, user: str | None = None) -> str:
    """The nginx configuration: deploy/nginx/toolrelay.conf's ``location`` on loopback ports, as a whole file.

    Differences from the compose one: fixed ``server`` lines (no Docker DNS), no upstream keep-alive (a
    connection idle in nginx's cache when its serve process drains would fail a POST that nginx may not
    retry; a fresh loopback connection per request costs about 0.1 ms), ``max_fails=1 fail_timeout=2s`` so a
    killed process leaves the rotation at its first refused connect and a restarted one is back 2 s later,
    ``X-Toolrelay-Upstream`` (which process answered, for ``make test-cluster``), and one more try on the
    next process for a request that failed before any answer (``proxy_next_upstream error non_idempotent``:
    a stopping process resets the connections it has not turned into requests yet), which needs the request
    body buffered by nginx (``proxy_request_buffering on``: nginx's ``client_max_body_size`` answers a body
    over the limit; the compose file streams bodies to the launcher's own 413).
    """
    servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;" for p in layout.serve_ports)
    run = layout.dir
    return f"""# Generated by scripts/cluster.py (make cluster); edits are overwritten at the next start.
{f"user {user};" if user else ""}
worker_processes 1;
pid {run / "run" / "nginx.pid"};
error_log {run / "logs" / "nginx-error.log"} warn;
daemon off;
events {{ worker_connections 4096; }}

http {{
    access_log off;
    client_body_temp_path {run / "nginx" / "client_body"};
    proxy_temp_path {run / "nginx" / "proxy"};
    fastcgi_temp_path {run / "nginx" / "fastcgi"};
    uwsgi_temp_path {run / "nginx" / "uwsgi"};
    scgi_temp_path {run / "nginx" / "scgi"};

    map $http_upgrade $connection_upgrade {{   # "upgrade" for the admin's WebSocket, "close" otherwise
        default upgrade;
        ''      close;
    }}

    upstream toolrelay {{
        least_conn;                            # streams last minutes: spread by open connections
        zone toolrelay 64k;
{servers}
    }}

    server {{
        listen 127.0.0.1:{layout.port} backlog=1024;
        client_max_body_size 32m;              # MAX_REQUEST_BYTES (the launcher's own check stays)

        location / {{
            proxy_pass http://toolrelay;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;   # replace, never append what the client sent
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            add_header X-Toolrelay-Upstream $upstream_addr always;
            # A POST that failed before any byte of an answer (a connection reset by a process that stops:
            # one still in its listen backlog, or not yet a request, when its drain closes the socket) is
            # tried once on the next process; nothing reached the client yet, so nothing is sent twice.
            proxy_next_upstream error non_idempotent;
            proxy_next_upstream_tries 2;

            proxy_buffering off;               # SSE: every event at once
            # The request body is read whole before it goes up (in memory up to 1 MiB): only a buffered
            # body can be sent again to the next process (proxy_next_upstream below).
            proxy_request_buffering on;
            client_body_buffer_size 1m;
            proxy_cache off;
            proxy_read_timeout 3600s;          # reasoning models can be silent for minutes
            proxy_send_timeout 3600s;
        }}
    }}
}}
"""


def cluster_env(layout: Layout, secrets: dict[str, str]) -> dict[str, str]:
    """The environment every process of the cluster gets (``secrets``: SECRET_KEY, CREDENTIAL_KEYS)."""
    return {
        **secrets,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": layout.database_url,
        "REDIS_URL": layout.redis_url,
        "REDIS_PREFIX": f"trcluster{layout.port}:",
        "JOURNAL_DIR": str(layout.path("journal")),
        "MEDIA_ROOT": str(layout.path("media")),
        "TOOLRELAY_VAR_DIR": str(layout.path("var")),
        "SITE_URL": f"http://127.0.0.1:{layout.port}",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "UPSTREAM_ALLOW_NETWORKS": "127.0.0.1/32",
        "SHUTDOWN_GRACE_SECONDS": "30",
        # The limits' Redis deadline (default 50 ms): on a loaded shared 2-core box Redis itself answers
        # later than that at times, and every such answer fails open; 250 ms keeps the state shared.
        "LIMITS_REDIS_TIMEOUT_SECONDS": "0.25",
        "LOG_LEVEL": "WARNING",
    }


# ----- processes: pid files, liveness, start and stop -----


def pid_of(layout: Layout, proc: Proc) -> int | None:
    """The live pid of ``proc`` (its pid file, a running non-zombie process with its marker), else None."""
    try:
        pid = int(layout.path("run", f"{proc.name}.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return pid if proc.marker in cmdline and state not in ("Z", "X") else None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our own loopback URL
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def spawn(layout: Layout, proc: Proc, env: dict[str, str]) -> int:
    """Start ``proc`` in a session of its own (it outlives this script), output to ``logs/NAME.log``."""
    with layout.path("logs", f"{proc.name}.log").open("ab") as log:
        child = subprocess.Popen(proc.argv, cwd=layout.root, env={**env, **proc.env}, stdin=subprocess.DEVNULL,  # noqa: S603
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    layout.path("run", f"{proc.name}.pid").write_text(str(child.pid))
    return child.pid


def wait_ready(layout: Layout, proc: Proc, timeout: float = 90.0) -> None:
    """Return once ``proc`` answers its ``ready`` URL (or runs); raise RuntimeError with its log's tail."""
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while time.monotonic() < deadline:
        if pid_of(layout, proc) is None and time.monotonic() - started > 5:  # (not yet exec'd at first)
            break
        if proc.ready is None or _answers(proc.ready):
            return
        time.sleep(0.2)
    tail = layout.path("logs", f"{proc.name}.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"{proc.name} did not become ready:\n{tail}")


def stop_proc(layout: Layout, proc: Proc, sig: int | None = None) -> None:
    """Send ``sig`` (default its stop signal), wait up to ``stop_timeout`` s for it to exit, then SIGKILL."""
    pid = pid_of(layout, proc)
    if pid is None:
        return
    os.kill(pid, sig or proc.stop_signal)
    deadline = time.monotonic() + proc.stop_timeout
    while pid_of(layout, proc) is not None:
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
        time.sleep(0.1)


# ----- Postgres and Redis: private servers under var/cluster -----


def postgres_running(layout: Layout) -> bool:
    return subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(layout.postgres_port)],  # noqa: S603, S607
                          check=False).returncode == 0


def postgres_pids(layout: Layout) -> list[int]:
    """The postmaster and its children (for a freeze), or [] when it is not running."""
    try:
        master = int(layout.path("pg", "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return []
    children = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True,  # noqa: S603, S607
                              check=False).stdout.split()
    return [master, *map(int, children)]


def start_postgres(layout: Layout) -> None:
    """``initdb`` on first use (as the postgres user: Postgres refuses root), start, create the database."""
    data = layout.path("pg")
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        shutil.chown(data, "postgres", "postgres")
        data.chmod(0o700)
        subprocess.run([*AS_POSTGRES, "initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"],  # noqa: S603
                       check=True, capture_output=True)
        layout.path("tenant.json").unlink(missing_ok=True)  # its key was in the database just replaced
    if not postgres_running(layout):
        log = layout.path("logs", "postgres.log")
        log.touch()
        shutil.chown(log, "postgres", "postgres")
        options = f"-h 127.0.0.1 -p {layout.postgres_port} -k {data} -c max_connections=100"
        subprocess.run([*AS_POSTGRES, "pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60",  # noqa: S603
                        "start"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["createdb", "-h", "127.0.0.1", "-p", str(layout.postgres_port), "-U", "postgres",  # noqa: S603, S607
                    "toolrelay"], check=False, capture_output=True)


def stop_postgres(layout: Layout) -> None:
    if postgres_running(layout) or postgres_pids(layout):
        subprocess.run([*AS_POSTGRES, "pg_ctl", "-D", str(layout.path("pg")), "-m", "fast", "-w", "stop"],  # noqa: S603
                       check=False, stdout=subprocess.DEVNULL)


def redis_pid(layout: Layout) -> int | None:
    try:
        pid = int(layout.path("run", "redis.pid").read_text())
        return pid if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes() else None
    except (OSError, ValueError):
        return None


def start_redis(layout: Layout) -> None:
    """A private redis-server (no persistence: limits and leases are short-lived state) on its port."""
    if redis_pid(layout) is None:
        layout.path("redis").mkdir(exist_ok=True)
        subprocess.run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1",  # noqa: S603, S607
                        "--port", str(layout.redis_port), "--save", "", "--appendonly", "no",
                        "--dir", str(layout.path("redis")), "--pidfile", str(layout.path("run", "redis.pid")),
                        "--logfile", str(layout.path("logs", "redis.log"))], check=True)
    for _ in range(100):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", layout.redis_port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("private Redis did not start (var/cluster/logs/redis.log)")


def stop_redis(layout: Layout) -> None:
    pid = redis_pid(layout)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if redis_pid(layout) is None:
                return
            time.sleep(0.1)


# ----- the whole cluster -----


def ensure_nginx() -> None:
    """Install the distribution's nginx with apt-get when it is missing (as root, or through sudo)."""
    if shutil.which("nginx") or Path("/usr/sbin/nginx").exists():
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print("cluster: installing the distribution's nginx (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)  # noqa: S603
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "nginx"], check=True, env=env)  # noqa: S603


def read_secrets(layout: Layout) -> dict[str, str]:
    """SECRET_KEY and CREDENTIAL_KEYS from the environment (``make cluster`` exports var/secrets.env)."""
    secrets = {name: os.environ.get(name, "") for name in ("SECRET_KEY", "CREDENTIAL_KEYS")}
    missing = [name for name, value in secrets.items() if not value]
    if missing:
        raise SystemExit(f"cluster: {', '.join(missing)} not set (run it through `make cluster`)")
    return secrets


def manage(layout: Layout, env: dict[str, str], *args: str) -> str:
    """Run ``manage.py ARGS`` with the cluster's environment; its stdout."""
    done = subprocess.run([layout.python, "manage.py", *args], cwd=layout.root, env=env,  # noqa: S603
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def provision(layout: Layout, env: dict[str, str]) -> None:
    """Migrate, register the schedules, and (once) make the demo tenant on the simulator; its key goes to
    ``tenant.json`` (0600). Every request of the tenant goes through the limits (Redis)."""
    manage(layout, env, "migrate", "--no-input", "-v", "0")
    manage(layout, env, "setup_schedules")
    target = layout.path("tenant.json")
    if target.exists():
        return
    upstream = f"http://127.0.0.1:{layout.simulator_port}/v1"
    args = ["provision", "--tenant", TENANT, "--upstream-url", upstream, "--upstream-key", "sk-simulator",
            "--route", "*", "--json"]
    made = json.loads(manage(layout, env, *args))
    if made["api_key"] is None:  # the tenant exists (tenant.json was removed): a new key
        made = json.loads(manage(layout, env, *args, "--new-key"))
    manage(layout, env, "limits", "set", "--tenant", TENANT, "--rpm", "1000000", "--concurrency", "1000")
    target.touch(mode=0o600)
    target.write_text(json.dumps({"api_key": made["api_key"], "base_url": f"http://127.0.0.1:{layout.port}/v1"}))


def prepare(layout: Layout) -> bool:
    """Make the folders and write nginx.conf; True when the configuration changed."""
    for sub in ("run", "logs", "journal", "media", "var", "nginx", "nginx/client_body", "nginx/proxy"):
        layout.path(sub).mkdir(parents=True, exist_ok=True)
    layout.dir.chmod(0o755)  # the postgres user reaches var/cluster/pg
    user = pwd.getpwuid(os.stat(layout.root).st_uid).pw_name if os.geteuid() == 0 else None
    conf, text = layout.path("nginx.conf"), nginx_conf(layout, user=user)
    changed = not conf.exists() or conf.read_text() != text
    if changed:
        conf.write_text(text)
    return changed


def start(layout: Layout, only: list[str] | None = None) -> None:
    """Start whatever of the cluster is not running; reload nginx if it runs and its configuration changed.

    ``only``: just those processes of the plan, when missing (a restart: no migration, no provisioning).
    """
    ensure_nginx()
    reload = prepare(layout)
    env = {**cluster_env(layout, read_secrets(layout)), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    layout.path("cluster.env").write_text("".join(f"{k}={v}\n" for k, v in cluster_env(layout, {}).items()))
    if only is None:
        start_postgres(layout)
        start_redis(layout)
        provision(layout, env)
    started = []
    for proc in plan(layout):
        if only is not None and proc.name not in only:
            continue
        if pid_of(layout, proc) is None:
            spawn(layout, proc, env)
            started.append(proc)
        elif proc.name == "nginx" and reload:  # only then: a reload closes the clients' idle keep-alive connections
            subprocess.run([*proc.argv, "-s", "reload"], check=True)  # noqa: S603
        if proc.name in ("simulator", "journal-writer"):
            wait_ready(layout, proc)  # the upstream and the writer before the first request
    for proc in started:
        wait_ready(layout, proc)
    names = ", ".join(p.name for p in started) or "nothing (all running)"
    print(f"cluster: started {names}; serving on http://127.0.0.1:{layout.port} (key in {layout.path('tenant.json')})")


def stop(layout: Layout) -> None:
    """Stop everything, in reverse order: nginx, the serve processes (drain), ..., Redis, Postgres."""
    procs = list(reversed(plan(layout)))
    stop_proc(layout, procs[0])
    serves = [p for p in procs if p.name.startswith("serve-")]
    for proc in serves:  # all drain at once
        pid = pid_of(layout, proc)
        if pid is not None:
            os.kill(pid, proc.stop_signal)
    for proc in procs[1:]:
        stop_proc(layout, proc)
    stop_redis(layout)
    stop_postgres(layout)
    print("cluster: stopped")


def status(layout: Layout) -> int:
    """Print one line per process; 0 when all run."""
    down = 0
    for proc in plan(layout):
        pid = pid_of(layout, proc)
        down += pid is None
        print(f"{proc.name:15} {'pid ' + str(pid) if pid else 'not running'}")
    print(f"{'redis':15} {'port ' + str(layout.redis_port) if redis_pid(layout) else 'not running'}")
    print(f"{'postgres':15} {'port ' + str(layout.postgres_port) if postgres_running(layout) else 'not running'}")
    return 1 if down else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("names", nargs="*", metavar="NAME", help="start: only these processes (e.g. serve-2)")
    args = parser.parse_args(argv)
    action, layout = args.action, layout_from_env()
    known = {p.name for p in plan(layout)}
    if set(args.names) - known:
        parser.error(f"unknown process {sorted(set(args.names) - known)}; the plan has {sorted(known)}")
    if action == "start":
        start(layout, args.names or None)
    elif action == "stop":
        stop(layout)
    else:
        return status(layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
