"""The audit journal: appends that never wait, a bound that drops bulk first, orphans of dead processes.

Real files, real ``flock``, a real writer thread against the test database, and a real process that
dies holding its journal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from audit.journal import Journal, encode, lock_orphan, read_lines, read_offset
from audit.journal_writer import JournalWriter
from audit.models import Attempt, ProxyRequest
from tests.conftest import TenantWorld


def _attempt(rid: str, body: str = "", fragment: str = "") -> dict[str, Any]:
    return {"t": "attempt", "id": rid, "number": 0, "tenant_id": 1, "body": body,
            "findings": [{"kind": "arguments-not-json", "fragment": fragment}]}


def test_it_appends_lines_that_read_back_exactly(tmp_path: Path) -> None:
    """Every record is one line; text with NUL bytes and lone surrogates reads back unchanged."""
    journal = Journal(tmp_path, max_bytes=1 << 20)
    records = [{"t": "start", "id": "a", "text": "x\x00y\udcff\u2603"}, {"t": "finish", "id": "a"}]
    for record in records:
        journal.append(record)
    lines = list(read_lines(journal.path, 0))
    assert [line.record for line in lines] == records
    assert lines[-1].end == journal.size == journal.path.stat().st_size
    assert journal.backlog == journal.size


def test_it_leaves_a_torn_last_line_for_later(tmp_path: Path) -> None:
    """A line cut by a crash mid-write is not read (and not lost: it is re-read once complete)."""
    path = tmp_path / "x.journal"
    whole = encode({"t": "start", "id": "a"})
    path.write_bytes(whole + b'{"t":"fin')
    assert [line.record["t"] for line in read_lines(path, 0)] == ["start"]
    path.write_bytes(whole + encode({"t": "finish", "id": "a"}))
    assert [line.record["t"] for line in read_lines(path, len(whole))] == ["finish"]


def test_it_drops_bodies_and_fragments_first_then_records_past_its_bound(tmp_path: Path) -> None:
    """Over the bound new records keep their findings but lose raw bodies and frame fragments; past twice
    the bound they are dropped; every drop is counted; nothing raises."""
    journal = Journal(tmp_path, max_bytes=350)
    journal.append(_attempt("a", body="B" * 300, fragment="F"))
    size_full = journal.size
    journal.append(_attempt("b", body="B" * 300, fragment="F"))
    slim = list(read_lines(journal.path, size_full))[0].record
    assert "body" not in slim and slim["findings"] == [{"kind": "arguments-not-json", "fragment": ""}]
    assert journal.dropped == {"body": 1, "fragment": 1}
    while journal.backlog <= 700:
        journal.append(_attempt("c"))
    before = journal.size
    journal.append(_attempt("d"))
    assert journal.size == before and journal.dropped["record"] == 1


def test_it_holds_its_file_locked_while_the_process_lives(tmp_path: Path) -> None:
    """A live journal cannot be taken as an orphan; once released it can."""
    journal = Journal(tmp_path, max_bytes=1 << 20)
    assert lock_orphan(journal.path) is None
    journal.close()
    fd = lock_orphan(journal.path)
    assert fd is not None


def test_it_empties_its_file_once_the_database_has_everything(tmp_path: Path) -> None:
    """Marking everything drained past 1 MB truncates the file, and appends go on from zero."""
    journal = Journal(tmp_path, max_bytes=1 << 30)
    for _ in range(1100):
        journal.append({"t": "start", "id": "a", "pad": "p" * 1000})
    journal.mark_drained(journal.size)
    assert journal.size == 0 and journal.path.stat().st_size == 0 and read_offset(journal.path) == 0
    journal.append({"t": "finish", "id": "a"})
    assert [line.record["t"] for line in read_lines(journal.path, 0)] == ["finish"]


@pytest.mark.django_db(transaction=True)
def test_it_drains_a_dead_processs_journal_and_interrupts_what_it_left_open(world_a: TenantWorld,
                                                                           tmp_path: Path) -> None:
    """A process killed mid-request (``os._exit`` with its journal locked and unsynced) leaves a start and an
    attempt; a new process's writer drains them, and the request is ``interrupted``, not ``pending``."""
    rid, done = str(uuid.uuid4()), str(uuid.uuid4())
    req = {"tenant_id": world_a.tenant.pk, "api_key_id": world_a.api_key.pk, "model": "m", "path": "guarded",
           "created": time.time()}
    records = [{"t": "start", "id": rid, "req": req},
               {"t": "attempt", "id": rid, "tenant_id": world_a.tenant.pk, "number": 0, "outcome": "retry",
                "findings": [{"kind": "arguments-not-json", "severity": "error", "action": "retry"}]},
               {"t": "start", "id": done, "req": req},
               {"t": "finish", "id": done, "req": req, "res": {"outcome": "clean", "status": 200}}]
    (tmp_path / "records.json").write_text(json.dumps(records))
    script = textwrap.dedent(f"""
        import json, os, pathlib, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from audit.journal import Journal
        journal = Journal(pathlib.Path({str(tmp_path)!r}), max_bytes=1 << 20)
        for record in json.loads(pathlib.Path({str(tmp_path / "records.json")!r}).read_text()):
            journal.append(record)
        os._exit(9)
    """)
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 9  # noqa: S603
    mine = Journal(tmp_path / "mine", max_bytes=1 << 20)
    writer = JournalWriter(mine, tmp_path)
    writer._scan_orphans()
    assert ProxyRequest.objects.get(id=rid).outcome == "interrupted"
    assert ProxyRequest.objects.get(id=done).outcome == "clean"
    assert Attempt.objects.filter(request_id=rid).count() == 1
    assert not list(tmp_path.glob("*.journal")), "the orphan's file is gone once drained"


@pytest.mark.django_db
def test_the_admin_says_when_the_journal_is_not_draining(admin_client: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With the writer's database down and a backlog, every admin page carries the banner; once it drains,
    none does."""
    from audit import journal_writer

    journal = Journal(tmp_path, max_bytes=1 << 30)
    journal.append({"t": "start", "id": "x", "pad": "p" * 2000})
    stuck = JournalWriter(journal, tmp_path)
    stuck.database, stuck.error = "down", "OperationalError: connection refused"
    monkeypatch.setattr(journal_writer, "_writer", stuck)
    page = admin_client.get("/admin/").content.decode()
    assert "The audit journal is not draining" in page and "connection refused" in page
    stuck.database = "ok"
    journal.mark_drained(journal.size)
    assert "not draining" not in admin_client.get("/admin/").content.decode()
