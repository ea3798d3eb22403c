"""The host's journal writer process: every serving process's journal into the database, outside them.

One per host (per ``JOURNAL_DIR``): ``manage.py serve`` starts it as a child and restarts it when it dies
(``Supervisor``, ``JOURNAL_WRITER=process``), or a deployment runs ``manage.py journal_writer`` itself
(``JOURNAL_WRITER=external``). A second one waits on ``writer.lock`` in ``JOURNAL_DIR`` (a standby).

Every ``JOURNAL_BATCH_SECONDS`` it looks at each journal file in ``JOURNAL_DIR``:

- a *shared* journal whose process lives (it holds the file's lock): fsync it (at most every
  ``JOURNAL_FSYNC_SECONDS``), write the records appended since the last batch in one transaction
  (``audit.services.journal_batch_write``, idempotent, bounded by ``DB_CALL_TIMEOUT_SECONDS``), hand their
  incidents to the live feed, and commit the offset in its ``.offset`` sidecar (which the serving process
  reads: its backlog bound, its rotation);
- a journal no process holds (its process stopped or died, ``kill -9`` too): drain the rest, mark its
  requests that started and never finished ``interrupted``, delete it;
- a journal of a live process with its own writer thread (``JOURNAL_WRITER=thread``): left to that thread.

While the database is down, slow or frozen the records stay in the journals (their processes bound them);
the writer backs off and tries again. Its state (``database`` ok/down, the error) goes to ``writer.state``
after every cycle, where the serving processes read it for ``/readyz`` and the admin banner. With ``--parent``
it exits (after a last cycle, which drains the dead parent's journal) when its parent is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections
from django.db.utils import OperationalError
from django.utils import timezone

from audit import incident_feed
from audit.incidents import Detector, journal_state
from audit.journal import SHARED, SUFFIX, Line, lock_orphan, read_lines, read_offset, write_offset
from audit.journal_writer import STATE_FILE, _ping, drain_orphan, write_batch
from infra import operator_alert
from infra.dbcall import bounded

logger = logging.getLogger(__name__)

LOCK_FILE = "writer.lock"
#: On SIGTERM (or when its parent is gone) the writer retries its last drain this long (seconds); serve's
#: ``Supervisor.stop`` waits longer before it kills it.
FINAL_DRAIN_SECONDS = 8.0
#: How long ``Supervisor.stop`` waits for a child that is still starting (its Django set-up) before SIGTERM.
STARTUP_SECONDS = 30.0


class HostWriter:
    """Drains every journal of ``directory`` (see the module docstring); ``cycle`` is one round."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.database = "unknown"
        self.error = ""
        self.dropped = 0
        self._positions: dict[str, int] = {}  # next byte to read, by live journal name
        self._published: dict[str, int] = {}  # end of the last record handed to the live feed, by name
        self._last_fsync = 0.0
        self._next_sweep = 0.0
        self._retry_at = 0.0
        self._last_ok = -1e9
        self._incidents = Detector()

    # ----- one round -----

    def cycle(self, *, final: bool = False) -> None:
        """Drain what there is now (``final``: ignore the backoff, as on shutdown); never raises."""
        now = time.monotonic()
        fsync = now - self._last_fsync >= settings.JOURNAL_FSYNC_SECONDS
        if fsync:
            self._last_fsync = now
        if now < self._retry_at and not final:
            self._fsync_live()
            return
        try:
            wrote = False
            for path in sorted(self.directory.glob(f"*{SUFFIX}")):
                fd = lock_orphan(path)
                if fd is not None:
                    try:
                        self._drain_orphan(path)
                    finally:
                        os.close(fd)
                elif path.name.endswith(SHARED + SUFFIX):
                    wrote = self._drain_live(path, fsync=fsync) or wrote
            self._forget_gone()
            if not wrote and now - self._last_ok >= settings.JOURNAL_PING_SECONDS:
                self._call(_ping)
            if now >= self._next_sweep:
                self._next_sweep = now + settings.JOURNAL_ORPHAN_SCAN_SECONDS
                self._call(_sweep_stale_pending)
                self._clean_sidecars()
        except Exception as exc:  # noqa: BLE001 - the writer must outlive any database trouble
            self._failed(exc)
        else:
            self._ok()
        self._report()

    def _fsync_live(self) -> None:
        for path in self.directory.glob(f"*{SHARED}{SUFFIX}"):
            _fsync(path)

    def _drain_live(self, path: Path, *, fsync: bool) -> bool:
        """Write what ``path`` held at the start of this round; True when there was anything."""
        name = path.name
        if fsync:
            _fsync(path)
        try:
            target = path.stat().st_size
        except FileNotFoundError:
            return False
        position = self._positions.get(name)
        if position is None:
            position = self._published[name] = read_offset(path)
        wrote = False
        while position < target:
            try:
                lines = list(read_lines(path, position))
            except FileNotFoundError:  # rotated away meanwhile: its process saw every record committed
                return wrote
            if not lines:
                break
            wrote = True
            self._publish(lines, name)
            self._write(lines, name)
            position = self._positions[name] = lines[-1].end
            if path.exists():
                write_offset(path, position)
        return wrote

    def _forget_gone(self) -> None:
        present = {p.name for p in self.directory.glob(f"*{SUFFIX}")}
        for table in (self._positions, self._published):
            for name in [n for n in table if n not in present]:
                del table[name]

    def _write(self, lines: list[Line], name: str) -> None:
        """One batch into the database; a record the database refuses for good is skipped and counted."""
        write_batch(lines, name, call=self._call, refused=self._refused, log=logger)

    def _refused(self) -> None:
        self.dropped += 1
        from infra import metrics

        metrics.JOURNAL_DROPPED.labels(what="refused").inc()

    def _publish(self, lines: list[Line], name: str) -> None:
        seen = self._published.get(name, 0)
        fresh = [line.record for line in lines if line.end > seen]
        self._published[name] = max(seen, lines[-1].end)
        incident_feed.publish(self._incidents.feed(fresh))

    def _call(self, fn: Any) -> Any:
        close_old_connections()
        return bounded(fn, timeout=settings.DB_CALL_TIMEOUT_SECONDS)

    def _drain_orphan(self, path: Path) -> None:
        drain_orphan(path, write=self._write, call=self._call, publish=self._publish)

    def _clean_sidecars(self) -> None:
        """Delete ``.offset`` sidecars whose journal is gone (a commit that raced a rotation)."""
        for sidecar in self.directory.glob("*.offset"):
            if not sidecar.with_suffix(SUFFIX).exists():
                sidecar.unlink(missing_ok=True)

    # ----- state -----

    def pending(self) -> bool:
        """True while a journal of a stopped process is left, or a live shared one has records not committed."""
        for path in self.directory.glob(f"*{SUFFIX}"):
            fd = lock_orphan(path)
            if fd is not None:
                os.close(fd)
                return True
        return self.backlog() > 0

    def backlog(self) -> int:
        """Bytes of live journals not yet committed (for the log lines)."""
        total = 0
        for path in self.directory.glob(f"*{SHARED}{SUFFIX}"):
            with contextlib.suppress(OSError):
                total += max(0, path.stat().st_size - self._positions.get(path.name, read_offset(path)))
        return total

    def _failed(self, exc: Exception) -> None:
        message = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        changed = self.database != "down"
        if changed:
            logger.warning("audit journal writer: the database is not taking records (%s); keeping them in %s",
                           message, self.directory)
        self.database, self.error = "down", message
        if changed:
            self._state_changed()
        self._retry_at = time.monotonic() + (0.5 if isinstance(exc, OperationalError) else 2.0)

    def _ok(self) -> None:
        self._last_ok = time.monotonic()
        changed = self.database == "down"
        if changed:
            logger.warning("audit journal writer: the database takes records again")
        self.database, self.error = "ok", ""
        if changed:
            self._state_changed()

    def _state_changed(self) -> None:
        item = journal_state(self.database, backlog=self.backlog(), error=self.error)
        incident_feed.publish([item])
        operator_alert.post(item)

    def _report(self) -> None:
        """Write ``writer.state`` (write and rename: never torn)."""
        path = self.directory / STATE_FILE
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps({"database": self.database, "error": self.error, "pid": os.getpid()}))
            os.replace(tmp, path)


def _fsync(path: Path) -> None:
    """fsync a journal another process appends to (flushes the file, whichever descriptor wrote it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sweep_stale_pending() -> int:
    """Requests left ``pending`` past any possible deadline (a journal lost with its machine): ``interrupted``."""
    from audit.models import ProxyRequest

    horizon = timezone.now() - timedelta(seconds=settings.REQUEST_DEADLINE_SECONDS + 600)
    stale = ProxyRequest.objects.filter(outcome=ProxyRequest.Outcome.PENDING, created__lt=horizon)
    return stale.update(outcome=ProxyRequest.Outcome.INTERRUPTED, finished=timezone.now(),
                        error="no proxy process finished this request within its deadline")


def run(stop: threading.Event, *, parent: int | None = None) -> None:
    """The writer process's main loop: take ``writer.lock`` (waiting while another writer has it), then a
    cycle every ``JOURNAL_BATCH_SECONDS`` until ``stop`` is set or ``parent`` is gone; a last cycle then."""
    directory = Path(settings.JOURNAL_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    lock = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    waited = False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if not waited:
                logger.warning("journal writer: another writer has %s; standing by", directory / LOCK_FILE)
                waited = True
            if stop.wait(1.0) or (parent is not None and os.getppid() != parent):
                os.close(lock)
                return
    logger.info("journal writer %d draining %s", os.getpid(), directory)
    host = HostWriter(directory)
    try:
        host.cycle()
        while not stop.is_set():
            if parent is not None and os.getppid() != parent:
                logger.warning("journal writer: its serving process %d is gone; a last drain, then exit", parent)
                break
            stop.wait(settings.JOURNAL_BATCH_SECONDS)
            host.cycle()
        deadline = time.monotonic() + FINAL_DRAIN_SECONDS
        host.cycle(final=True)
        while host.database != "ok" and time.monotonic() < deadline and host.pending():
            time.sleep(0.2)  # the database refused the last drain: try again while the deadline allows
            host.cycle(final=True)
    finally:
        with contextlib.suppress(Exception):
            connections.close_all()
        os.close(lock)


class Supervisor(threading.Thread):
    """``manage.py serve``'s child writer process: started now, restarted (after 1 s) whenever it exits,
    stopped by ``stop`` (SIGTERM: its last drain, bounded; then SIGKILL)."""

    def __init__(self) -> None:
        super().__init__(name="toolrelay-journal-supervisor", daemon=True)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._ready: int | None = None  # the read end of the child's readiness pipe

    def argv(self, ready_fd: int) -> list[str]:
        """The child's command line: this Python, this project's manage.py, ``journal_writer --parent``."""
        return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "journal_writer", "--skip-checks",
                "--parent", str(os.getpid()), "--ready-fd", str(ready_fd)]

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start the child; it writes a byte to a pipe once its SIGTERM handler is in place (``stop`` waits)."""
        if self._ready is not None:
            os.close(self._ready)
        read, write = os.pipe()
        try:
            process = subprocess.Popen(self.argv(write), cwd=settings.BASE_DIR,  # noqa: S603
                                       stdin=subprocess.DEVNULL, pass_fds=(write,),
                                       start_new_session=True)  # a terminal's Ctrl-C reaches serve, which stops it
        except OSError:
            os.close(read)
            raise
        finally:
            os.close(write)
        self._ready = read
        return process

    def run(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                if self._stopping.is_set():
                    return
                self.process = self._spawn()
            code = self.process.wait()
            if self._stopping.is_set():
                return
            self.restarts += 1
            logger.error("journal writer process exited (status %s); restarting it", code)
            self._stopping.wait(1.0)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the child (it drains what it can within its bounded calls), SIGKILL after ``timeout`` s."""
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is None or process.poll() is not None:
            return
        if self._ready is not None:  # a child still starting would die of SIGTERM before its last drain
            with contextlib.suppress(OSError, ValueError):
                select.select([self._ready], [], [], STARTUP_SECONDS)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
