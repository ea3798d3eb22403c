"""The journal writer: what moves journal records into the database, in the serving process or beside it.

Where it runs is ``JOURNAL_WRITER`` (``configure``, called by ``manage.py serve``): with ``process`` or
``external`` the serving process only appends to a shared journal (``Journal(shared=True)``) and runs a
``Keeper`` thread that never touches the database (it reads the committed offset and the writer's state from
``JOURNAL_DIR``, and rotates the file); the host's writer process (``audit.host_writer``: a child of
``manage.py serve``, or ``manage.py journal_writer``) does the rest. With ``thread`` (any process that did not
configure otherwise: tests, a shell) it is the ``JournalWriter`` thread below, in the process itself.

Every ``JOURNAL_BATCH_SECONDS`` it fsyncs this process's journal (at most every
``JOURNAL_FSYNC_SECONDS``), reads the records appended since the last batch, and writes them in one
transaction (``audit.services.journal_batch_write``: bulk inserts, idempotent), with a client-side
deadline of ``DB_CALL_TIMEOUT_SECONDS`` (``infra.dbcall.bounded``). While the database is down,
slow or frozen the records stay in the journal, which keeps growing up to its bound; the writer
backs off and tries again, and drains the backlog when the database is back. Every state change is
one log line; ``status()`` feeds ``/readyz``, the metrics and the admin banner.

At start and every ``JOURNAL_ORPHAN_SCAN_SECONDS`` it drains the journal files of dead processes
(those whose lock it can take), marks their requests that started and never ended
``interrupted``, and deletes the files. Requests left ``pending`` past any possible deadline (a
journal lost with its machine) are marked ``interrupted`` too.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections
from django.db.utils import DataError, IntegrityError, OperationalError
from django.utils import timezone

from audit import incident_feed, services
from audit.incidents import ROUTING_KINDS, Detector, journal_state
from audit.journal import SUFFIX, Journal, Line, lock_orphan, read_lines, read_offset
from infra import operator_alert
from infra.dbcall import bounded

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_journal: Journal | None = None
_writer: JournalWriter | Keeper | None = None
_shared = False
#: The writer process's state file in ``JOURNAL_DIR`` (``audit.host_writer``), read by the ``Keeper``.
STATE_FILE = "writer.state"


def configure(*, shared: bool) -> None:
    """Before the first ``journal()``: ``shared`` True when the host's writer process drains this process's
    journal (``JOURNAL_WRITER`` ``process`` / ``external``), False for a writer thread here (the default)."""
    global _shared
    _shared = shared


def journal() -> Journal:
    """This process's journal (created, with its writer thread or its keeper, on first use)."""
    global _journal, _writer
    if _journal is not None:
        return _journal
    with _lock:
        if _journal is None:
            directory = Path(settings.JOURNAL_DIR)
            _journal = Journal(directory, max_bytes=settings.JOURNAL_MAX_BYTES, shared=_shared)
            _writer = Keeper(_journal) if _shared else JournalWriter(_journal, directory)
            _writer.start()
            atexit.register(shutdown)
    return _journal


def writer() -> JournalWriter | Keeper | None:
    """The running writer (or keeper), if any record was journaled in this process."""
    return _writer


def drained(timeout: float = 10.0) -> bool:
    """Block until this process's journal is in the database (tests); True at once when nothing was journaled."""
    return _writer is None or _writer.wait_drained(timeout)


def shutdown(timeout: float = 5.0) -> None:
    """Drain what the database will take within ``timeout`` s, fsync and release the journal (exit, SIGTERM)."""
    if _writer is not None:
        _writer.stop(timeout)


@dataclass(frozen=True, slots=True)
class Status:
    """The writer's view: ``database`` ``ok`` / ``down`` / ``unknown``, the backlog in bytes, the last error."""

    database: str
    backlog: int
    error: str = ""
    dropped: int = 0


class _JournalThread(threading.Thread):
    """What the keeper and the writer thread share: the journal they serve, the database state they report
    (``database`` ok/down/unknown and the last ``error``), a wake-up event and a stop event."""

    def __init__(self, journal: Journal, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.journal = journal
        self.database = "unknown"
        self.error = ""
        self._wake = threading.Event()
        self._stopping = threading.Event()

    def status(self) -> Status:
        """The database state and this process's backlog (cheap; safe from any thread)."""
        return Status(self.database, self.journal.backlog, self.error, sum(self.journal.dropped.values()))

    def kick(self) -> None:
        """Look now instead of at the next interval (tests, shutdown)."""
        self._wake.set()


class Keeper(_JournalThread):
    """The serving process's side of a shared journal: no database, no ORM, never on the event loop.

    Every ``JOURNAL_BATCH_SECONDS`` it takes the offset the writer process committed (so the backlog bound
    and ``/readyz`` see what the database has), rotates the file once the database has all of it, and reads
    the writer's state (``STATE_FILE``: ``database`` ok/down, the error; ``unknown`` when missing or stale).
    The writer process fsyncs the file; on ``stop`` the keeper fsyncs and releases it (the writer then drains
    what is left as a stopped process's journal).
    """

    def __init__(self, journal: Journal) -> None:
        super().__init__(journal, "toolrelay-journal-keeper")

    def wait_drained(self, timeout: float = 10.0) -> bool:
        """Block until the writer process committed every record appended so far; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.journal.refresh_drained() == 0:
                return True
            time.sleep(0.02)
        return self.journal.refresh_drained() == 0

    def release_connection(self, timeout: float = 5.0) -> bool:
        """Nothing to release: the keeper holds no database connection."""
        return True

    def stop(self, timeout: float) -> None:
        """Fsync and release the journal (the writer process drains the rest); once (serve, then atexit)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        with contextlib.suppress(OSError, ValueError):
            self.journal.fsync()
        self.journal.close()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.look()
            self._wake.wait(settings.JOURNAL_BATCH_SECONDS)
            self._wake.clear()

    def look(self) -> None:
        """One round: the committed offset, a rotation when due, the writer's state (never raises)."""
        try:
            self.journal.refresh_drained()
            self.journal.rotate()
            self.database, self.error = read_state(self.journal.directory)
        except Exception:  # noqa: BLE001 - the keeper must outlive any file trouble
            logger.exception("journal keeper: a round failed")
        from infra import metrics

        metrics.JOURNAL_BACKLOG.set(self.journal.backlog)
        metrics.DATABASE_UP.set(1 if self.database == "ok" else 0)


def read_state(directory: Path) -> tuple[str, str]:
    """The writer process's ``(database, error)`` from ``STATE_FILE``; ``("unknown", why)`` when it is missing,
    unreadable or older than a writer cycle can take (``DB_CALL_TIMEOUT_SECONDS`` twice, plus 10 s)."""
    import json

    path = directory / STATE_FILE
    try:
        age = time.time() - path.stat().st_mtime
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return "unknown", "no journal writer process has reported yet"
    if age > 2 * settings.DB_CALL_TIMEOUT_SECONDS + 10:
        return "unknown", f"the journal writer process has not reported for {age:.0f} s"
    if not isinstance(state, dict) or state.get("database") not in ("ok", "down"):
        return "unknown", "the journal writer's state is unreadable"
    return str(state["database"]), str(state.get("error", ""))[:300]


class JournalWriter(_JournalThread):
    """Drains ``journal`` (and orphaned journals in ``directory``) into the database."""

    def __init__(self, journal: Journal, directory: Path) -> None:
        super().__init__(journal, "toolrelay-journal-writer")
        self.directory = directory
        self._position = 0  # the next byte of our journal to read
        self._stopped = threading.Event()
        self._release = threading.Event()
        self._released = threading.Event()
        self._last_fsync = 0.0
        self._next_scan = 0.0
        self._retry_at = 0.0
        self._last_ok = -1e9  # ping at the first idle cycle
        self._incidents = Detector()
        self._published = 0  # the end of the last record of our journal handed to the live incident feed

    # ----- control -----

    def wait_drained(self, timeout: float = 10.0) -> bool:
        """Block until the database has every record appended so far (tests); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.journal.backlog == 0:
                return True
            self.kick()
            time.sleep(0.01)
        return self.journal.backlog == 0

    def release_connection(self, timeout: float = 5.0) -> bool:
        """Have the writer close its database connection now (tests, before the test database is dropped);
        it reconnects when it next needs one. False when the writer did not answer in time."""
        if not self.is_alive():
            return True
        self._released.clear()
        self._release.set()
        self._wake.set()
        return self._released.wait(timeout)

    def stop(self, timeout: float) -> None:
        """Final drain (bounded), fsync, release the file."""
        self._stopping.set()
        self._wake.set()
        self._stopped.wait(timeout)
        with contextlib.suppress(OSError):
            self.journal.fsync()
        self.journal.close()

    # ----- the loop -----

    def run(self) -> None:
        try:
            self._cycle()  # at once: orphans of dead processes, and the database's state
            while not self._stopping.is_set():
                self._wake.wait(settings.JOURNAL_BATCH_SECONDS)
                self._wake.clear()
                self._cycle()
                if self._release.is_set():
                    connections.close_all()
                    self._release.clear()
                    self._released.set()
            self._retry_at = 0.0
            self._cycle()  # the final drain on shutdown
        finally:
            with contextlib.suppress(Exception):
                connections.close_all()
            self._stopped.set()

    def _cycle(self) -> None:
        now = time.monotonic()
        if now - self._last_fsync >= settings.JOURNAL_FSYNC_SECONDS and self.journal.size:
            with contextlib.suppress(OSError):
                self.journal.fsync()
            self._last_fsync = now
        if now < self._retry_at:
            return
        try:
            if not self._drain_own() and now - self._last_ok >= settings.JOURNAL_PING_SECONDS:
                self._call(_ping)
            if now >= self._next_scan:
                self._next_scan = now + settings.JOURNAL_ORPHAN_SCAN_SECONDS
                self._scan_orphans()
        except Exception as exc:  # noqa: BLE001 - the writer must outlive any database trouble
            self._failed(exc)
        else:
            self._ok()

    def _drain_own(self) -> bool:
        """Write what our journal held at the start of this cycle; True when there was anything.

        One batch per cycle (more only while a read comes back full): what arrives meanwhile waits for the
        next cycle, so batches stay large under load. Looping at once would write a trickle of tiny batches,
        each a transaction (measured: ~2.3 ms CPU per request instead of ~0.2 ms).
        """
        target = self.journal.size
        wrote = False
        while self._position < target:
            lines = list(read_lines(self.journal.path, self._position))
            if not lines:
                return wrote
            wrote = True
            self._publish(lines)
            self._write(lines, self.journal.path.name)
            self._position = lines[-1].end
            self.journal.mark_drained(self._position)
            if self.journal.size == 0:
                self._position = self._published = 0
                break
        if wrote:
            self._gauge()
        return wrote

    def _write(self, lines: list[Line], name: str) -> None:
        """One batch into the database; a record the database refuses for good is skipped and counted."""
        write_batch(lines, name, call=self._call, refused=self._refused, log=logger)

    def _refused(self) -> None:
        self.journal.dropped["refused"] = self.journal.dropped.get("refused", 0) + 1

    def _publish(self, lines: list[Line]) -> None:
        """Hand the incidents of records not seen before to the live feed (once each, also when the database
        refuses the batch and it is read again; bounded, never raises)."""
        fresh = [line.record for line in lines if line.end > self._published]
        self._published = max(self._published, lines[-1].end)
        found = self._incidents.feed(fresh)
        incident_feed.publish(found)
        for item in found:
            if item["kind"] in ROUTING_KINDS:  # circuits and keys: the operator's webhook too
                operator_alert.post(item)

    def _call(self, fn: Any) -> Any:
        close_old_connections()
        return bounded(fn, timeout=settings.DB_CALL_TIMEOUT_SECONDS)

    # ----- orphans: journals of dead processes -----

    def _scan_orphans(self) -> None:
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            if path == self.journal.path:
                continue
            fd = lock_orphan(path)
            if fd is not None:
                try:
                    self._drain_orphan(path)
                finally:
                    os.close(fd)
        self._call(self._sweep_stale_pending)

    def _drain_orphan(self, path: Path) -> None:
        drain_orphan(path, write=self._write, call=self._call)

    @staticmethod
    def _sweep_stale_pending() -> int:
        from audit.models import ProxyRequest

        horizon = timezone.now() - timedelta(seconds=settings.REQUEST_DEADLINE_SECONDS + 600)
        stale = ProxyRequest.objects.filter(outcome=ProxyRequest.Outcome.PENDING, created__lt=horizon)
        return stale.update(outcome=ProxyRequest.Outcome.INTERRUPTED, finished=timezone.now(),
                            error="no proxy process finished this request within its deadline")

    # ----- state -----

    def _failed(self, exc: Exception) -> None:
        message = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        changed = self.database != "down"
        if changed:
            logger.warning("audit journal: the database is not taking records (%s); keeping them in %s "
                           "(backlog %d bytes)", message, self.journal.path, self.journal.backlog)
        self.database, self.error = "down", message
        if changed:
            self._state_changed()
        backoff = 0.5 if isinstance(exc, OperationalError) else 2.0
        self._retry_at = time.monotonic() + backoff
        self._gauge()

    def _ok(self) -> None:
        self._last_ok = time.monotonic()
        changed = self.database == "down"
        if changed:
            logger.warning("audit journal: the database takes records again; backlog %d bytes", self.journal.backlog)
        self.database, self.error = "ok", ""
        self._gauge()
        if changed:
            self._state_changed()

    def _state_changed(self) -> None:
        """The database went down or came back: tell the live feed and the operator's webhook (both bounded)."""
        item = journal_state(self.database, backlog=self.journal.backlog, error=self.error)
        incident_feed.publish([item])
        operator_alert.post(item)

    def _gauge(self) -> None:
        from infra import metrics

        metrics.JOURNAL_BACKLOG.set(self.journal.backlog)
        metrics.DATABASE_UP.set(1 if self.database == "ok" else 0)


def _ping() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")


def write_batch(lines: list[Line], name: str, *, call: Callable[[Any], Any], refused: Callable[[], None],
                log: logging.Logger) -> None:
    """Write journal ``lines`` of file ``name`` in one batch through ``call`` (the writer's bounded database
    call). A batch the database refuses (``IntegrityError``, ``DataError``) is halved until the one record
    it refuses for good is found: that record is logged, skipped and counted through ``refused``; every
    other record is written. Records of unknown requests that the database skips are logged. Raises what
    ``call`` raises otherwise (a database down is the caller's to retry)."""
    batch = services.Batch.of(line.record for line in lines)
    try:
        skipped = call(lambda: services.journal_batch_write(batch))
    except (IntegrityError, DataError) as exc:
        if len(lines) == 1:
            log.error("journal %s: a record was refused by the database and is skipped: %s", name, exc)
            refused()
            return
        middle = len(lines) // 2
        write_batch(lines[:middle], name, call=call, refused=refused, log=log)
        write_batch(lines[middle:], name, call=call, refused=refused, log=log)
        return
    if skipped:
        log.warning("journal %s: %d attempt record(s) of unknown requests skipped", name, skipped)


def drain_orphan(path: Path, *, write: Callable[[list[Line], str], None], call: Callable[[Any], Any],
                 publish: Callable[[list[Line], str], None] | None = None) -> None:
    """Write what is left of a stopped process's journal at ``path`` (past its committed offset) with
    ``write(lines, name)`` (after ``publish(lines, name)`` to the live feed, when given), mark its requests
    that started and never finished as interrupted (``call`` runs the database call, bounded), and delete the
    journal and its offset sidecar. The caller holds the orphan's lock (``lock_orphan``)."""
    started: set[str] = set()
    ended: set[str] = set()
    position = read_offset(path)
    for lines in _chunks(path, 0):  # every record, for the start/end bookkeeping
        for line in lines:
            kind, rid = line.record.get("t"), line.record.get("id")
            if kind == "start" and isinstance(rid, str):
                started.add(rid)
            elif kind == "finish" and isinstance(rid, str):
                ended.add(rid)
        todo = [line for line in lines if line.end > position]
        if todo:
            if publish is not None:
                publish(todo, path.name)
            write(todo, path.name)
    interrupted = call(lambda: services.requests_interrupt(ids=started - ended))
    logger.info("journal %s of a stopped process drained; %d request(s) interrupted", path.name, interrupted)
    path.unlink(missing_ok=True)
    path.with_suffix(".offset").unlink(missing_ok=True)


def _chunks(path: Path, offset: int) -> Any:
    """``read_lines`` in bounded chunks until the end of ``path``."""
    while True:
        lines = list(read_lines(path, offset))
        if not lines:
            return
        yield lines
        offset = lines[-1].end
