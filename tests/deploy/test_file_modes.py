"""Files holding tenants' data are private to toolrelay's user (issue 24 item 12): the SQLite database (and
its -wal / -shm files) and report files were created 0644, readable by every local user."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage

ROOT = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_sqlite_database_and_its_journal_are_0600(tmp_path: Path) -> None:
    db = tmp_path / "var" / "toolrelay.sqlite3"
    code = ("import django; django.setup(); from django.db import connection; "
            "c = connection.cursor(); c.execute('create table t (x int)'); c.execute('insert into t values (1)')")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": f"sqlite:///{db}"}
    old = os.umask(0o022)
    try:
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)  # noqa: S603
    finally:
        os.umask(old)
    files = [p for p in db.parent.iterdir() if p.name.startswith("toolrelay.sqlite3")]
    assert db in files and {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}


def test_an_existing_world_readable_database_is_made_private(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite3"
    db.write_bytes(b"")
    db.chmod(0o644)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": f"sqlite:///{db}"}
    subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env, check=True)  # noqa: S603
    assert _mode(db) == 0o600


@pytest.mark.parametrize("name", ["reports/2026/12/usage.csv"])
def test_report_files_and_their_folders_are_private(tmp_path: Path, settings: Any, name: str) -> None:
    settings.MEDIA_ROOT = str(tmp_path)
    storage = FileSystemStorage()  # what FileField uses (settings read at save)
    saved = storage.save(name, ContentFile(b"tenant,requests\n"))
    path = tmp_path / saved
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
