"""The host's journal writer (``audit.host_writer``): it drains the shared journals of live serving processes,
and those of dead ones, and leaves a live process's own-thread journal alone; the serving side (the keeper)
learns the committed offset and the writer's state from files, and rotates a drained journal.

Real files, real ``flock``, the test database, and a real process that dies holding its journal.
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

from audit.host_writer import HostWriter
from audit.journal import Journal, read_offset
from audit.journal_writer import Keeper
from audit.models import Attempt, ProxyRequest
from tests.conftest import TenantWorld


def _request(world: TenantWorld, rid: str, *, finished: bool) -> list[dict[str, Any]]:
    req = {"tenant_id": world.tenant.pk, "api_key_id": world.api_key.pk, "model": "m", "path": "guarded",
           "created": time.time()}
    records: list[dict[str, Any]] = [
        {"t": "start", "id": rid, "req": req},
        {"t": "attempt", "id": rid, "tenant_id": world.tenant.pk, "number": 0, "outcome": "clean", "findings": []}]
    if finished:
        records.append({"t": "finish", "id": rid, "req": req, "res": {"outcome": "clean", "status": 200}})
    return records


@pytest.mark.django_db(transaction=True)
def test_it_drains_a_live_shared_journal_and_the_serving_side_sees_it_committed(world_a: TenantWorld,
                                                                                tmp_path: Path) -> None:
    journal = Journal(tmp_path, max_bytes=1 << 20, shared=True)
    keeper = Keeper(journal)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    for record in _request(world_a, first, finished=True):
        journal.append(record)
    writer = HostWriter(tmp_path)
    writer.cycle()
    assert ProxyRequest.objects.get(id=first).outcome == "clean"
    assert read_offset(journal.path) == journal.size and journal.path.exists(), "live: committed, kept"
    keeper.look()
    assert keeper.status().database == "ok" and keeper.status().backlog == 0
    old = journal.path
    assert journal.rotate(threshold=0) and not old.exists() and journal.path.exists()
    for record in _request(world_a, second, finished=True):
        journal.append(record)
    writer.cycle()
    assert ProxyRequest.objects.get(id=second).outcome == "clean"
    assert Attempt.objects.filter(request_id__in=[first, second]).count() == 2, "each record once"
    journal.close()  # the process stops: the writer drains what is left and deletes the file
    writer.cycle()
    assert not list(tmp_path.glob("*.journal")) and not list(tmp_path.glob("*.offset"))


@pytest.mark.django_db(transaction=True)
def test_it_interrupts_what_a_killed_serving_process_left_open(world_a: TenantWorld, tmp_path: Path) -> None:
    rid = str(uuid.uuid4())
    (tmp_path / "records.json").write_text(json.dumps(_request(world_a, rid, finished=False)))
    script = textwrap.dedent(f"""
        import json, os, pathlib, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from audit.journal import Journal
        journal = Journal(pathlib.Path({str(tmp_path)!r}), max_bytes=1 << 20, shared=True)
        for record in json.loads(pathlib.Path({str(tmp_path / "records.json")!r}).read_text()):
            journal.append(record)
        os._exit(9)
    """)
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 9  # noqa: S603
    HostWriter(tmp_path).cycle()
    assert ProxyRequest.objects.get(id=rid).outcome == "interrupted"
    assert not list(tmp_path.glob("*.journal"))


@pytest.mark.django_db(transaction=True)
def test_it_leaves_a_live_process_s_own_thread_journal_to_that_thread(world_a: TenantWorld, tmp_path: Path) -> None:
    journal = Journal(tmp_path, max_bytes=1 << 20)  # not shared: its process's writer thread drains it
    rid = str(uuid.uuid4())
    for record in _request(world_a, rid, finished=True):
        journal.append(record)
    HostWriter(tmp_path).cycle()
    assert not ProxyRequest.objects.filter(id=rid).exists() and read_offset(journal.path) == 0
    journal.close()


def test_the_keeper_reports_unknown_without_a_writer_and_never_rotates_an_undrained_journal(tmp_path: Path) -> None:
    journal = Journal(tmp_path, max_bytes=1 << 20, shared=True)
    journal.append({"t": "start", "id": "x", "pad": "p" * 100})
    keeper = Keeper(journal)
    keeper.look()
    assert keeper.status().database == "unknown" and keeper.status().backlog > 0
    assert not journal.rotate(threshold=0), "records the database does not have yet stay in their file"
    (tmp_path / "writer.state").write_text(json.dumps({"database": "down", "error": "OperationalError: frozen"}))
    keeper.look()
    assert (keeper.status().database, keeper.status().error) == ("down", "OperationalError: frozen")
    journal.close()
