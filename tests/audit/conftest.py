"""Audit fixtures: a hand-checkable set of audit rows, report storage, and a real Celery worker.

The fixture set (``audit_rows``) is small enough that every figure of a report over it is computed
by hand in ``tests/audit/expected.py``. The worker is ``celery -A config worker --pool=solo`` in a
subprocess, on the machine's Redis, consuming a queue of its own (other sessions may share the
Redis) and using the test database, so tests that hand it work commit their rows
(``transactional_db``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6379
#: The Redis database the test broker uses (the queue name is unique per session as well).
REDIS_DB = 11
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PERIOD = (T0, T0 + timedelta(days=3))


# ----- audit rows -----

@dataclass
class AuditRows:
    """The fixture set: tenant A's two upstreams, and the requests by name (r1..r9)."""

    upstream_a: Any
    qwen_a: Any
    upstream_b: Any
    requests: dict[str, Any]


def add_request(tenant: Any, upstream: Any, name: str, *, at: datetime, model: str, path: str = "guarded",
                outcome: str = "clean", attempts: int = 1, agent: str = "claude-cli/1.0.5", completion: int = 100,
                wasted: int = 0, wasted_ms: float = 0.0, findings: Sequence[tuple[int, str, str, str, str]] = ()
                ) -> Any:
    """One request with ``attempts`` attempts and ``findings`` as (attempt, kind, severity, action, tool)."""
    from audit.models import Attempt, Finding, ProxyRequest

    request = ProxyRequest.objects.create(
        tenant=tenant, upstream=upstream, model=model, upstream_model=model, path=path, outcome=outcome,
        attempts=attempts, status=200, total_ms=1000.0, prompt_tokens=1000, completion_tokens=completion,
        wasted_completion_tokens=wasted, wasted_ms=wasted_ms, client_user_agent=agent, created=at,
        finished=at + timedelta(seconds=5), error="")
    rows = [Attempt.objects.create(request=request, number=n, upstream=upstream, upstream_model=model,
                                   outcome="ok" if n == attempts - 1 else "retry", created=at)
            for n in range(attempts)]
    for i, (number, kind, severity, action, tool) in enumerate(findings):
        Finding.objects.create(request=request, attempt=rows[number], tenant_id_copy=tenant.pk, kind=kind,
                               severity=severity, action=action, tool_name=tool, frame=3 + i, byte_offset=120 + i,
                               fragment=f'data: {{"n": {i}, "name": "{name}"}}', detail=f"{kind} in {name}",
                               created=at + timedelta(seconds=1))
    return request


def make_audit_rows(world_a: Any, world_b: Any) -> AuditRows:
    """Seven requests of tenant A in the period, two of A just outside it, one of B inside it."""
    from tenants.models import Upstream

    a, b = world_a.tenant, world_b.tenant
    up, qwen = world_a.upstream, Upstream.objects.create(tenant=a, name="tenant-a-qwen",
                                                         base_url="https://qwen.test/v1")
    day = [T0 + timedelta(days=n) for n in range(3)]
    codex = "codex_cli_rs/0.9"
    r = {
        "r1": add_request(a, up, "r1", at=day[0] + timedelta(hours=10), model="deepseek-chat", completion=100),
        "r2": add_request(a, up, "r2", at=day[0] + timedelta(hours=11), model="deepseek-chat",
                          outcome="recovered-by-retry", attempts=2, completion=150, wasted=50, wasted_ms=1500,
                          findings=[(0, "arguments-not-json", "error", "retry", "read_file")]),
        "r3": add_request(a, qwen, "r3", at=day[0] + timedelta(hours=12), model="qwen-coder", path="pass-through",
                          agent=codex, completion=80),
        "r4": add_request(a, qwen, "r4", at=day[1] + timedelta(hours=9), model="qwen-coder", outcome="exhausted",
                          attempts=3, agent=codex, completion=120, wasted=120, wasted_ms=4000,
                          findings=[(0, "schema-violation", "error", "retry", "edit_file"),
                                    (1, "schema-violation", "error", "retry", "edit_file"),
                                    (2, "mid-stream-error-chunk", "error", "retry", "")]),
        "r5": add_request(a, up, "r5", at=day[1] + timedelta(hours=10), model="deepseek-chat", outcome="normalized",
                          completion=90, findings=[(0, "sse-comment-keepalives", "info", "ignored", ""),
                                                   (0, "name-repeated-every-chunk", "info", "normalized",
                                                    "read_file")]),
        "r7": add_request(a, up, "r7", at=day[1] + timedelta(hours=11), model="deepseek-chat", outcome="repaired",
                          completion=110,
                          findings=[(0, "code-fence-prefix-in-arguments", "warning", "repaired", "read_file")]),
        "r6": add_request(a, up, "r6", at=day[2] + timedelta(hours=8), model="deepseek-chat",
                          outcome="recovered-by-retry", attempts=3, completion=200, wasted=80, wasted_ms=2500,
                          findings=[(0, "arguments-not-json", "error", "retry", "read_file"),
                                    (1, "upstream-timeout", "error", "retry", "")]),
        # Outside the half-open period [T0, T0 + 3 days): just before it, and exactly at its end.
        "before": add_request(a, up, "before", at=T0 - timedelta(seconds=1), model="deepseek-chat",
                              outcome="exhausted", attempts=3, wasted=999, wasted_ms=9999,
                              findings=[(0, "arguments-not-json", "error", "retry", "read_file")]),
        "at_end": add_request(a, up, "at_end", at=PERIOD[1], model="deepseek-chat", outcome="exhausted",
                              findings=[(0, "arguments-not-json", "error", "retry", "read_file")]),
        # Tenant B, inside the period.
        "r9": add_request(b, world_b.upstream, "r9", at=day[1] + timedelta(hours=12), model="tenant-b-model",
                          outcome="recovered-by-retry", attempts=2, wasted=10, wasted_ms=100,
                          findings=[(0, "arguments-not-json", "error", "retry", "bash")]),
    }
    return AuditRows(up, qwen, world_b.upstream, r)


@pytest.fixture
def audit_rows(world_a: Any, world_b: Any) -> AuditRows:
    """The fixture set of audit rows (see ``make_audit_rows``)."""
    return make_audit_rows(world_a, world_b)


@pytest.fixture(autouse=True)
def _report_storage(settings: Any, tmp_path: Path) -> Path:
    """Report files of each test go to its own directory."""
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


# ----- Redis and the worker -----

def redis_ping() -> bool:
    """True when the machine's Redis answers."""
    import redis

    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False
    finally:
        client.close()


def ensure_redis() -> None:
    """Start the machine's Redis when it is down (as .ci/run does), then wait until it answers."""
    if redis_ping():
        return
    Path("/var/lib/redis").mkdir(parents=True, exist_ok=True)
    Path("/var/log/redis").mkdir(parents=True, exist_ok=True)
    argv = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", str(REDIS_PORT),
            "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"]
    subprocess.run(argv, check=True)  # noqa: S603 - fixed argv (redis-server from PATH, as .ci/run does)
    deadline = time.monotonic() + 15
    while not redis_ping():
        if time.monotonic() > deadline:
            raise RuntimeError("Redis did not come up on 127.0.0.1:6379")
        time.sleep(0.2)


def database_url() -> str:
    """The test database as a DATABASE_URL, for the worker process."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db.get("USER") or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    host = f"{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}"
    return f"postgres://{auth}{'@' if auth else ''}{host}/{db['NAME']}"


@dataclass
class Worker:
    """A running Celery worker: its broker, queue, report directory and log."""

    broker: str
    queue: str
    media: Path
    log: Path
    process: subprocess.Popen[bytes]


def _wait_ready(worker: Worker, timeout: float = 45) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = worker.log.read_text(errors="replace") if worker.log.exists() else ""
        if " ready." in text:
            return
        if worker.process.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError("the Celery worker did not start:\n" + (worker.log.read_text() if worker.log.exists() else ""))


@pytest.fixture(scope="session")
def celery_worker(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Worker]:
    """``celery -A config worker --pool=solo`` on Redis db ``REDIS_DB`` and a queue of its own."""
    ensure_redis()
    with django_db_blocker.unblock():
        db_url = database_url()
    base = tmp_path_factory.mktemp("celery")
    queue = f"audit-test-{uuid.uuid4().hex[:10]}"
    broker = f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}"
    env = {**os.environ, "DATABASE_URL": db_url, "CELERY_BROKER_URL": broker, "MEDIA_ROOT": str(base / "media"),
           "DB_CONN_MAX_AGE": "0", "DEBUG": "1"}
    log = base / "worker.log"
    process = subprocess.Popen(  # noqa: S603 - fixed argv
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=solo", "-Q", queue, "-n", f"{queue}@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO", "-f", str(log)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = Worker(broker, queue, base / "media", log, process)
    try:
        _wait_ready(worker)
        yield worker
    finally:
        import kombu.pools

        kombu.pools.reset()  # the test process's broker connections
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def on_worker(celery_worker: Worker, settings: Any) -> Iterator[Worker]:
    """Send this test's tasks to the real worker (not eager), reading its report files."""
    from config.celery import app

    saved = {key: app.conf[key] for key in ("broker_url", "task_always_eager", "task_default_queue",
                                            "broker_transport_options")}
    # The worker's settings put its Redis keys under the deployment prefix (REDIS_PREFIX): so does this sender.
    app.conf.update(broker_url=celery_worker.broker, task_always_eager=False, task_default_queue=celery_worker.queue,
                    broker_transport_options={"global_keyprefix": settings.REDIS_PREFIX})
    _reset_connections(app)
    settings.MEDIA_ROOT = str(celery_worker.media)
    yield celery_worker
    app.conf.update(saved)
    _reset_connections(app)


def _reset_connections(app: Any) -> None:
    """Forget the app's broker pool so the next send uses the current ``broker_url``.

    The pools themselves stay in kombu's registry (keyed by URL) and are closed with the worker.
    """
    app._pool = None
    app.amqp._producer_pool = None
    app.amqp.__dict__.pop("queues", None)
    app.amqp.__dict__.pop("router", None)


def wait_for_report(report_id: int, *, timeout: float = 30) -> tuple[Any, list[tuple[str, int]]]:
    """Poll report ``report_id`` until done or failed; returns it and the (status, progress) pairs seen."""
    from audit.models import Report

    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = Report.objects.get(pk=report_id)
        if not seen or seen[-1] != (report.status, report.progress):
            seen.append((report.status, report.progress))
        if report.is_finished:
            return report, seen
        time.sleep(0.05)
    raise AssertionError(f"report {report_id} did not finish; seen {seen}")


def join_eager_threads(timeout: float = 30) -> None:
    """Wait for the background threads eager tasks run in (no DB writes may outlive a test)."""
    for thread in threading.enumerate():
        if thread.name.startswith("eager "):
            thread.join(timeout)


@pytest.fixture
def eager_threads() -> Iterator[Callable[[], None]]:
    """Joins eager task threads after the test, whatever happened."""
    yield join_eager_threads
    join_eager_threads()
