"""End-to-end fixtures: the proxy served by a real Daphne process under toolrelay's launcher
(``manage.py serve``), the simulator as its upstream, the test database (Postgres in CI) shared
between this process and the server.

Rows are created and read outside test transactions (``django_db_blocker.unblock()``), so the Daphne
process sees them; every test makes its own tenant, so tests do not depend on each other.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection

from proxy.simulator import start_in_thread

ROOT = Path(__file__).resolve().parents[2]
#: Short-lived auth cache so a revoked key is refused quickly in the tests.
AUTH_CACHE_SECONDS = "1"
#: The simulator and the test upstreams listen on loopback, which the outbound address policy
#: refuses unless allowed: the tests allow it, in Daphne and in this process, as `make run` does.
ALLOW_LOOPBACK = "127.0.0.0/8"
#: Every test client is 127.0.0.1: the wrong-key throttle is set out of reach of tests that send bad keys
#: on purpose (tests/e2e/test_limits.py starts a server with a low bound).
WRONG_KEYS = "100000"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _database_url() -> str:
    settings = connection.settings_dict
    if settings["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings['NAME']}"
    user = settings.get("USER") or ""
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{settings['NAME']}"


@pytest.fixture(scope="session")
def simulator() -> Iterator[Any]:
    """The fault-injecting upstream, in a thread of this process."""
    sim = start_in_thread(host="127.0.0.1", port=0)
    yield sim
    sim.stop()


@dataclass
class ProxyServer:
    """A running ``manage.py serve`` (Daphne under toolrelay's launcher) serving ``config.asgi``."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def running_proxy(database_url: str, log: Path, *, listening: socket.socket | None = None,
                  **settings: str) -> Iterator[ProxyServer]:
    """``manage.py serve`` on a free port (or on the inherited socket ``listening``, ``--fd``) against
    ``database_url``, with the e2e environment plus ``settings`` (environment variables), its audit
    journal in ``journal/`` beside ``log``; stopped (SIGTERM, then SIGKILL after 10 s) on exit."""
    port = _free_port() if listening is None else int(listening.getsockname()[1])
    where = ["--host", "127.0.0.1", "--port", str(port)] if listening is None else ["--fd", str(listening.fileno())]
    journal = log.parent / "journal"
    journal.mkdir(exist_ok=True)
    env = {**os.environ, "DATABASE_URL": database_url, "AUTH_CACHE_SECONDS": AUTH_CACHE_SECONDS,
           "RETRY_BACKOFF_BASE_SECONDS": "0.01", "RETRY_AFTER_MAX_SECONDS": "1", "DB_CONN_MAX_AGE": "0",
           "LOG_LEVEL": "WARNING", "JOURNAL_DIR": str(journal), "JOURNAL_BATCH_SECONDS": "0.02",
           "UPSTREAM_ALLOW_NETWORKS": ALLOW_LOOPBACK, "WRONG_KEY_LIMIT_PER_MINUTE": WRONG_KEYS, **settings}
    # --skip-checks: the tests run with the placeholder SECRET_KEY and no CREDENTIAL_KEYS (as this
    # process does, which encrypts the credentials the server decrypts), which the checks refuse.
    with log.open("wb") as handle:
        process = subprocess.Popen(  # noqa: S603 - fixed argv
            [sys.executable, "manage.py", "serve", "--skip-checks", *where], cwd=ROOT, env=env, stdout=handle,
            stderr=subprocess.STDOUT, pass_fds=() if listening is None else (listening.fileno(),),
        )
        server = ProxyServer(f"http://127.0.0.1:{port}", process, log)
        try:
            _wait_ready(server)
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="session")
def e2e_database_url(django_db_setup: Any, django_db_blocker: Any) -> str:
    """The test database's URL, for server processes."""
    with django_db_blocker.unblock():
        return _database_url()


@pytest.fixture(scope="session")
def proxy_server(e2e_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    """The launcher on a free port, against the test database, with the default limits."""
    with running_proxy(e2e_database_url, tmp_path_factory.mktemp("serve") / "serve.log") as server:
        yield server


def _wait_ready(server: ProxyServer) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"manage.py serve exited: {server.log.read_text()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"manage.py serve did not become ready: {server.log.read_text()}")


@dataclass
class TenantFixture:
    """A provisioned tenant: its row, its raw API key and the proxy base URL for OpenAI clients."""

    tenant: Any
    api_key: str
    base_url: str
    upstream: Any


@pytest.fixture
def make_tenant(proxy_server: ProxyServer, simulator: Any, django_db_blocker: Any
                ) -> Callable[..., TenantFixture]:
    """Provision a fresh tenant whose default upstream is the simulator (``upstream_key`` its credential)."""

    def make(*, upstream_key: str = "sk-sim-upstream-key", **policy: Any) -> TenantFixture:
        from tenants.services import provision

        with django_db_blocker.unblock():
            done = provision(tenant_name=f"t-{uuid.uuid4().hex[:10]}", upstream_url=simulator.url,
                             upstream_key=upstream_key)
            if policy:
                for name, value in policy.items():
                    setattr(done.tenant, name, value)
                done.tenant.save()
        return TenantFixture(done.tenant, done.raw_key or "", proxy_server.v1, done.upstream)

    return make


@pytest.fixture
def audit_rows(django_db_blocker: Any) -> Callable[..., Any]:
    """Wait for the proxy's background audit write of request ``request_id`` and return the row."""

    def fetch(request_id: str, *, timeout: float = 10.0) -> Any:
        from audit.models import ProxyRequest

        deadline = time.monotonic() + timeout
        with django_db_blocker.unblock():
            while time.monotonic() < deadline:
                row = ProxyRequest.objects.filter(id=request_id).exclude(outcome="pending").first()
                if row is not None:
                    return row
                time.sleep(0.05)
        raise AssertionError(f"no finished audit row for request {request_id}")

    return fetch


@pytest.fixture(autouse=True)
def _allow_loopback_upstreams(settings: Any) -> None:
    """Upstreams saved by these tests (the simulator) are on loopback: allowed here as in Daphne."""
    settings.UPSTREAM_ALLOW_NETWORKS = [ALLOW_LOOPBACK]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every end-to-end test uses the test database in autocommit mode (so Daphne sees its rows);
    pytest-django only creates test databases for tests that ask for them."""
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.django_db(transaction=True))


@pytest.fixture(autouse=True)
def _proxy_quiet_after_test(request: pytest.FixtureRequest, transactional_db: Any) -> Iterator[None]:
    """Before the test database is flushed, wait until the proxy has written every audit row:
    a flush racing Daphne's background writes deadlocks on Postgres."""
    yield
    if "proxy_server" not in request.fixturenames:
        return
    server = request.getfixturevalue("proxy_server")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        backlog = httpx.get(f"{server.url}/readyz", timeout=5).json()["journal_backlog_bytes"]  # live, not a gauge
        if _gauge(metrics, "toolrelay_requests_in_flight") == 0 and backlog == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the proxy still has requests in flight or audit records unwritten 15 s after the test")


def _gauge(metrics: str, name: str) -> float:
    """A gauge's value in a Prometheus exposition (0 when the gauge has no sample yet)."""
    line = next((x for x in metrics.splitlines() if x.startswith(f"{name} ")), "")
    return float(line.split()[1]) if line else 0.0


#: The proxy asks guarded upstreams for usage, so their usage-only chunk is the protocol, not the
#: C36 quirk; through the proxy that case shows as captured usage instead of a finding.
REQUESTED_USAGE_KIND = "usage-only-chunk-empty-choices"


@pytest.fixture
def assert_case_audited(django_db_blocker: Any) -> Callable[[dict[str, Any], str], None]:
    """Assert the audit of ``request_id`` shows the fault of corpus ``case`` (a finding of its kind)."""

    def check(case: dict[str, Any], request_id: str) -> None:
        from audit.models import Finding, ProxyRequest

        with django_db_blocker.unblock():
            kinds = set(Finding.objects.filter(request_id=request_id).values_list("kind", flat=True))
            row = ProxyRequest.objects.get(id=request_id)
        if case["kind"] != REQUESTED_USAGE_KIND:
            assert case["kind"] in kinds
            return
        usage = next(json.loads(c)["usage"] for c in case["upstream_chunks"] if '"usage"' in c)
        assert REQUESTED_USAGE_KIND not in kinds
        assert (row.prompt_tokens, row.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])

    return check
