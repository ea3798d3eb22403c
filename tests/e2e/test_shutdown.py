"""Stopping a proxy process: SIGTERM drains open streams; a killed process's requests end ``interrupted``.

Real ``manage.py serve`` processes, the simulator as upstream, the test database read back.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import running_proxy

#: 20 paced frames, 100 ms apart: a 2 s stream.
SLOW = "slow:20:frame=100"


def _stream(url: str, key: str, out: dict[str, Any], started: threading.Event) -> None:
    """Read one slow pass-through stream; record its request id, bytes and whether it ended with [DONE]."""
    body = {"model": SLOW, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30,
                          headers={"authorization": f"Bearer {key}"}) as response:
            out["request_id"] = response.headers.get("x-request-id")
            data = b""
            for chunk in response.iter_bytes():
                data += chunk
                started.set()
            out["body"] = data
    except httpx.HTTPError as exc:
        out["error"] = exc
    finally:
        started.set()


def _refuses_connections(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except OSError:
        return True


def _row(django_db_blocker: Any, request_id: str, *, timeout: float = 15.0) -> Any:
    from audit.models import ProxyRequest

    deadline = time.monotonic() + timeout
    with django_db_blocker.unblock():
        while time.monotonic() < deadline:
            row = ProxyRequest.objects.filter(id=request_id).exclude(outcome="pending").first()
            if row is not None:
                return row
            time.sleep(0.05)
    raise AssertionError(f"no final audit row for {request_id}")


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_sigterm_stops_accepting_and_lets_an_open_stream_finish(writer: str, make_tenant: Any, e2e_database_url: str,
                                                                tmp_path: Path, django_db_blocker: Any) -> None:
    """SIGTERM mid-stream: new connections are refused at once, the open stream ends normally, the process
    exits 0 soon after, and the request's audit row is written (the journal is flushed at exit; with the writer
    its own process, that process's last drain writes it)."""
    tenant = make_tenant()
    with running_proxy(e2e_database_url, tmp_path / "a.log", SHUTDOWN_GRACE_SECONDS="10",
                       JOURNAL_WRITER=writer) as server:
        out: dict[str, Any] = {}
        started = threading.Event()
        reader = threading.Thread(target=_stream, args=(server.url, tenant.api_key, out, started))
        reader.start()
        assert started.wait(10)
        os.kill(server.process.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert _refuses_connections(server.url), "a draining process accepts no new connection"
        reader.join(15)
        assert "error" not in out and out["body"].endswith(b"data: [DONE]\n\n"), "the open stream finished"
        assert server.process.wait(10) == 0
    assert _row(django_db_blocker, out["request_id"]).outcome == "clean"


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_killed_process_leaves_its_open_request_interrupted_not_pending(writer: str, make_tenant: Any,
                                                                          e2e_database_url: str, tmp_path: Path,
                                                                          django_db_blocker: Any) -> None:
    """``kill -9`` in a request's first attempt: the next process on the same journal folder (or, with the
    writer its own process, that process at once) drains the dead one's journal and the request becomes
    ``interrupted`` (a final state), with its start on record."""
    tenant = make_tenant()
    out: dict[str, Any] = {}
    with running_proxy(e2e_database_url, tmp_path / "a.log", JOURNAL_WRITER=writer) as first:
        started = threading.Event()
        reader = threading.Thread(target=_stream, args=(first.url, tenant.api_key, out, started))
        reader.start()
        assert started.wait(10)
        first.process.kill()
        reader.join(10)
    assert out.get("request_id")
    with running_proxy(e2e_database_url, tmp_path / "b.log", JOURNAL_WRITER=writer):
        row = _row(django_db_blocker, out["request_id"])
    assert row.outcome == "interrupted" and row.model == SLOW


@pytest.mark.parametrize("grace", ["0.5"])
def test_a_stream_longer_than_the_grace_period_is_cut_and_interrupted(grace: str, make_tenant: Any,
                                                                      e2e_database_url: str, tmp_path: Path,
                                                                      django_db_blocker: Any) -> None:
    """Past ``SHUTDOWN_GRACE_SECONDS`` the process stops anyway; its cut request is ``interrupted`` once a
    process drains the journal (never ``pending`` forever)."""
    tenant = make_tenant()
    out: dict[str, Any] = {}
    with running_proxy(e2e_database_url, tmp_path / "a.log", SHUTDOWN_GRACE_SECONDS=grace) as first:
        started = threading.Event()
        reader = threading.Thread(target=_stream, args=(first.url, tenant.api_key, out, started))
        reader.start()
        assert started.wait(10)
        os.kill(first.process.pid, signal.SIGTERM)
        assert first.process.wait(10) == 0
        reader.join(10)
    assert not out.get("body", b"").endswith(b"data: [DONE]\n\n")
    with running_proxy(e2e_database_url, tmp_path / "b.log"):
        assert _row(django_db_blocker, out["request_id"]).outcome == "interrupted"


def _writer_children(pid: int) -> list[int]:
    """The journal writer children of process ``pid`` (from /proc: their parent and command line)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if parent == pid and b"journal_writer" in argv:
            found.append(int(stat.parent.name))
    return found


def test_the_journal_writer_process_is_restarted_when_it_dies(make_tenant: Any, e2e_database_url: str,
                                                            tmp_path: Path, django_db_blocker: Any) -> None:
    """``JOURNAL_WRITER=process``: serve's child writer killed (``kill -9``) is started again, and the requests
    served meanwhile and after reach the database; serve itself keeps serving throughout."""
    tenant = make_tenant()
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {tenant.api_key}"}
    with running_proxy(e2e_database_url, tmp_path / "a.log", JOURNAL_WRITER="process") as server:
        deadline = time.monotonic() + 15
        while not (first := _writer_children(server.process.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(first) == 1, "serve started one writer process"
        os.kill(first[0], signal.SIGKILL)
        ids = []
        for _ in range(3):
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
            assert response.status_code == 200
            ids.append(response.headers["x-request-id"])
        deadline = time.monotonic() + 15
        while not (second := [p for p in _writer_children(server.process.pid) if p not in first]) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(second) == 1, "a new writer process replaced the killed one"
        rows = [_row(django_db_blocker, request_id) for request_id in ids]
    assert {row.outcome for row in rows} == {"clean"}
