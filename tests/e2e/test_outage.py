"""The proxy and its audit when Postgres is stopped or frozen (issue: fault tolerance, items 1 and 2).

A private Postgres cluster (``tests/e2e/private_pg.py``; never the CI's own) behind a real
``manage.py serve``, the simulator as upstream, openai-python as the client. Across a stop and a
freeze: known keys keep being served at their usual speed, unknown keys get a retryable 503, /readyz
stays 200 and says the database is down, and once the database is back the journal drains: every
request, attempt and finding of the outage is in the database exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import ALLOW_LOOPBACK, ROOT, ProxyServer, running_proxy
from tests.e2e.private_pg import PrivatePostgres

TOOL = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
#: A guarded request whose first attempt is broken (a finding and a retry), then recovered.
RECOVERED = "gen:calls=1:broken=1:kinds=fused-truncated-sse-frames"


@dataclass
class Outage:
    pg: PrivatePostgres
    server: ProxyServer
    known: str
    unknown: str


def _manage(url: str, *args: str) -> str:
    env = {**os.environ, "DATABASE_URL": url, "UPSTREAM_ALLOW_NETWORKS": ALLOW_LOOPBACK}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,  # noqa: S603
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module", params=["process", "thread"])
def outage(simulator: Any, request: pytest.FixtureRequest) -> Iterator[Outage]:
    """A private cluster and a server whose journal writer is its child process (``JOURNAL_WRITER=process``,
    the serving process does no database work for the audit) or a thread of it (``thread``)."""
    # Not pytest's tmp_path: the postgres user must reach the folder (pytest-of-root is private).
    folder = Path(tempfile.mkdtemp(prefix="toolrelay-outage-"))
    pg = PrivatePostgres(folder)
    pg.start()
    try:
        _manage(pg.url, "migrate", "--skip-checks", "-v0")
        known = json.loads(_manage(pg.url, "provision", "--skip-checks", "--tenant", "outage", "--upstream-url",
                                   simulator.url, "--upstream-key", "sk-outage", "--json"))["api_key"]
        unknown = json.loads(_manage(pg.url, "apikey", "--skip-checks", "create", "--tenant", "outage",
                                     "--json"))["api_key"]
        # Every request here is recovered by a retry: past the tenant's retry budget (at most 50% more calls,
        # at least 10 retries per 10 minutes) they would get one attempt, so the budget's floor is raised.
        with running_proxy(pg.url, folder / "serve.log", AUTH_CACHE_SECONDS="1", DB_CALL_TIMEOUT_SECONDS="3",
                           DB_CONNECT_TIMEOUT_SECONDS="1", JOURNAL_BATCH_SECONDS="0.05",
                           JOURNAL_PING_SECONDS="0.5", RETRY_BUDGET_MIN_RETRIES="1000",
                           JOURNAL_WRITER=request.param) as server:
            yield Outage(pg, server, known, unknown)
    finally:
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _guarded(server: ProxyServer, key: str) -> tuple[str, float]:
    """One guarded, recovered request: its request id and how long it took (seconds)."""
    started = time.monotonic()
    messages = [{"role": "user", "content": f"weather [{uuid.uuid4().hex}]"}]
    with openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=30) as client, \
            client.chat.completions.stream(model=RECOVERED, messages=messages, tools=TOOL) as stream:
        final = stream.get_final_completion()
        request_id = stream._response.headers["x-request-id"]
    assert final.choices[0].message.tool_calls
    return request_id, time.monotonic() - started


def _ready(server: ProxyServer) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/readyz", timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _ready_down(server: ProxyServer, timeout: float = 8.0) -> dict[str, Any]:
    """``/readyz`` once it reports the database down (the writer learns it within its bounded call,
    DB_CALL_TIMEOUT_SECONDS, plus a batch cycle; a loaded box may take a little longer), always 200."""
    deadline = time.monotonic() + timeout
    state = _ready(server)
    while state["database"] != "down" and time.monotonic() < deadline:
        time.sleep(0.1)
        state = _ready(server)
    return state


def _drained(server: ProxyServer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _ready(server)
        if state["database"] == "ok" and state["journal_backlog_bytes"] == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"the journal did not drain: {_ready(server)}")


def _refused_unknown(outage: Outage) -> float:
    started = time.monotonic()
    response = httpx.post(f"{outage.server.v1}/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {outage.unknown}"},
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert response.status_code == 503 and response.headers["x-should-retry"] == "true"
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "auth_unavailable"
    return time.monotonic() - started


def _audited_once(pg: PrivatePostgres, ids: list[str]) -> None:
    """Every request once, recovered, with exactly its two attempts and the broken one's finding."""
    quoted = ",".join(f"'{uuid.UUID(i)}'" for i in ids)  # UUIDs the server sent: safe in the query text
    rows = pg.sql(f"select id, outcome, attempts from audit_proxyrequest where id in ({quoted})")  # noqa: S608
    assert sorted(r[0] for r in rows) == sorted(ids)
    assert {r[1] for r in rows} == {"recovered-by-retry"} and {r[2] for r in rows} == {"2"}
    attempts = pg.sql(f"select request_id, count(*) from audit_attempt where request_id in ({quoted}) "  # noqa: S608
                      "group by request_id")
    assert {r[1] for r in attempts} == {"2"} and len(attempts) == len(ids)
    findings = pg.sql("select count(distinct request_id) from audit_finding "  # noqa: S608
                      f"where request_id in ({quoted}) and kind = 'fused-truncated-sse-frames'")
    assert findings == [(str(len(ids)),)]


def test_it_serves_known_keys_and_loses_no_audit_row_while_postgres_is_stopped(outage: Outage) -> None:
    before = [_guarded(outage.server, outage.known)[0] for _ in range(3)]
    _drained(outage.server)
    outage.pg.stop()
    try:
        during = [_guarded(outage.server, outage.known) for _ in range(8)]
        time.sleep(1.2)  # past AUTH_CACHE_SECONDS: served from the last good answer, not the cache
        during += [_guarded(outage.server, outage.known) for _ in range(4)]
        _refused_unknown(outage)
        state = _ready_down(outage.server)
        assert state["database"] == "down" and state["journal_backlog_bytes"] > 0
    finally:
        outage.pg.start()
    _drained(outage.server)
    _audited_once(outage.pg, before + [request_id for request_id, _ in during])


def test_a_frozen_postgres_slows_nothing_down_and_loses_nothing(outage: Outage) -> None:
    _guarded(outage.server, outage.known)
    _drained(outage.server)
    baseline = max(_guarded(outage.server, outage.known)[1] for _ in range(3))
    pids = outage.pg.freeze()
    try:
        during = [_guarded(outage.server, outage.known) for _ in range(10)]
        time.sleep(1.5)
        during += [_guarded(outage.server, outage.known) for _ in range(5)]
        waited = _refused_unknown(outage)
        state = _ready_down(outage.server)
    finally:
        outage.pg.thaw(pids)
    slow = sorted(seconds for _, seconds in during)
    # A known key waits at most KNOWN_KEY_WAIT (0.25 s) for a lookup before its last good answer is served;
    # one that waited for the frozen database would take DB_CALL_TIMEOUT_SECONDS (3 s) or more.
    assert slow[-1] < baseline + 1.5, (baseline, slow)
    assert waited < 5.0, "an unknown key learns of the outage within the bounded call"
    assert state["database"] == "down"
    _drained(outage.server)
    _audited_once(outage.pg, [request_id for request_id, _ in during])


def _sockets_to(pid: int, port: int) -> int:
    """How many TCP sockets process ``pid`` holds open to ``port`` on loopback (its fds against
    /proc/PID/net/tcp: the kernel's table, so a socket blocked on a frozen peer counts too)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                count += 1
    return count


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parts = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(parts[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize("outage", ["process"], indirect=True)
def test_with_postgres_frozen_a_cached_key_is_served_by_a_process_that_holds_no_database_connection(
        outage: Outage) -> None:
    """The serving process does no database work beside its requests: with the database frozen, requests of a
    key whose principal is cached complete (before the thaw), while the serving process holds no connection
    to the database at all; the journal writer, its child process, is the one blocked on it. Any wait for
    the frozen database would take the 60 s of its bounded calls, past the client's 30 s."""
    folder = Path(tempfile.mkdtemp(prefix="toolrelay-writer-"))
    try:
        with running_proxy(outage.pg.url, folder / "serve.log", JOURNAL_WRITER="process", AUTH_CACHE_SECONDS="600",
                           DB_CALL_TIMEOUT_SECONDS="60", DB_CONNECT_TIMEOUT_SECONDS="60",
                           JOURNAL_BATCH_SECONDS="0.05", JOURNAL_PING_SECONDS="0.5",
                           RETRY_BUDGET_MIN_RETRIES="1000") as server:
            first = _guarded(server, outage.known)[0]  # the key's principal is cached for 600 s now
            _drained(server)
            pids = outage.pg.freeze()
            try:
                during = [_guarded(server, outage.known)[0] for _ in range(5)]
                writers = _children(server.process.pid)
                blocked = 0
                deadline = time.monotonic() + 15
                while not blocked and time.monotonic() < deadline:  # the writer is writing these requests' rows
                    blocked = sum(_sockets_to(pid, outage.pg.port) for pid in writers)
                    time.sleep(0.1)
                serving = _sockets_to(server.process.pid, outage.pg.port)
            finally:
                outage.pg.thaw(pids)
            assert serving == 0, "the serving process holds a connection to the database"
            assert blocked >= 1, f"no child of the serving process is writing to the database ({writers})"
            _drained(server)
            _audited_once(outage.pg, [first, *during])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
