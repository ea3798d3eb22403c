"""The audit journal: a per-process, append-only file of audit records that the byte path never waits for.

Every audit record (a request started, an attempt with its findings and raw body, a request
finished) is appended at once, as one JSON line, to this process's journal file in ``JOURNAL_DIR``.
An appended line is in the kernel's page cache the moment ``os.write`` returns, so it survives the
process dying (``kill -9``); the writer (``audit.journal_writer``: the host's writer process, or a thread
of this process with ``JOURNAL_WRITER=thread``) fsyncs the file every ``JOURNAL_FSYNC_SECONDS`` (a group
fsync bounds what a machine crash can lose) and moves the records into the database in batches.

File: ``<host>-<pid>-<start unix ms>.journal``, held under an exclusive ``flock`` for the process's
life, with a sidecar ``.offset`` (the byte offset up to which the database has every record). A
process that starts drains every journal file it can lock, which are those of dead processes (also
after a container was replaced, with ``JOURNAL_DIR`` a shared volume), never a live sibling's.

Bound: the backlog (bytes not yet in the database) is kept under ``JOURNAL_MAX_BYTES``: past it,
new records lose their raw bodies and frame fragments first; past twice the bound whole records are
dropped. Nothing ever refuses traffic; every drop is counted (``toolrelay_journal_dropped_total``).

Why files and not SQLite (measured by ``bench/journal_micro.py``, docs/benchmarks.md): an append is
one ``os.write`` of a line already encoded, a few microseconds on the event loop with no lock
contention against the reader, and a torn last line after a crash is simply skipped; a SQLite
journal costs a transaction per record or a lock shared with the writer thread.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SUFFIX = ".journal"
#: The name tag of a journal drained by the host's writer process (``audit.journal_writer.HostWriter``) while its
#: serving process lives; a journal without it is drained by its own process's writer thread.
SHARED = ".shared"
#: Keys of an attempt record that are dropped first when the journal is over its bound.
_BULKY = ("body",)


@dataclass(frozen=True, slots=True)
class Line:
    """One record read back: ``record`` (the decoded JSON object) and ``end`` (the offset after its line)."""

    record: dict[str, Any]
    end: int


def encode(record: dict[str, Any]) -> bytes:
    """One record as a JSON line: ASCII-only, so any text (NUL bytes, lone surrogates of undecodable
    upstream bytes) survives the round trip exactly; ``json.loads`` restores it."""
    return json.dumps(record, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def read_lines(path: Path, offset: int, *, limit: int = 8 << 20) -> Iterator[Line]:
    """Complete, decodable lines of ``path`` from ``offset`` (at most ``limit`` bytes read); a torn last
    line is left for later, an undecodable one is skipped with a warning."""
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read(limit)
    position = offset
    for raw in data.splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            return
        position += len(raw)
        try:
            record = json.loads(raw)
        except ValueError:
            logger.warning("journal %s: skipped an undecodable line ending at byte %d", path.name, position)
            continue
        if isinstance(record, dict):
            yield Line(record, position)


def read_offset(path: Path) -> int:
    """The committed offset of journal ``path`` (0 when it has none yet)."""
    try:
        return int(path.with_suffix(".offset").read_text() or 0)
    except (OSError, ValueError):
        return 0


def write_offset(path: Path, offset: int) -> None:
    """Persist the committed offset of ``path`` (write and rename: never a torn offset)."""
    sidecar = path.with_suffix(".offset")
    tmp = sidecar.with_suffix(".offset.tmp")
    tmp.write_text(str(offset))
    os.replace(tmp, sidecar)


class Journal:
    """This process's journal file: ``append`` (event loop, never raises), the backlog and drop counts.

    ``max_bytes`` bounds the backlog (see the module docstring). ``drained`` is advanced by the writer: the
    thread's ``mark_drained``, or, with ``shared`` (the host's writer process drains it), ``refresh_drained``
    from the ``.offset`` sidecar that process writes; a shared journal is rotated (``rotate``), never truncated,
    since its reader is another process.
    """

    def __init__(self, directory: Path, *, max_bytes: int, shared: bool = False) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.shared = shared
        self.max_bytes = max_bytes
        self._generation = 0
        self.path = self._name()
        self._fd = self._open(self.path)
        self._lock = threading.Lock()
        self.size = 0  # bytes appended since the file was last emptied
        self.drained = 0  # bytes of the file the database has
        self.dropped: dict[str, int] = {}
        self.appended = 0  # records appended (for tests and metrics)

    def _name(self) -> Path:
        tag = f"-{self._generation}{SHARED}" if self.shared else ""
        return self.directory / f"{socket.gethostname()}-{os.getpid()}-{int(time.time() * 1000)}{tag}{SUFFIX}"

    @staticmethod
    def _open(path: Path) -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    @property
    def backlog(self) -> int:
        """Bytes appended and not yet in the database."""
        return self.size - self.drained

    def append(self, record: dict[str, Any]) -> None:
        """Append one record now. Over the bound, bulky parts go first, then whole records (counted)."""
        backlog = self.backlog
        if backlog > self.max_bytes:
            if backlog > 2 * self.max_bytes:
                self._drop("record")
                return
            record = self._slim(record)
        try:
            line = encode(record)
        except (TypeError, ValueError):
            logger.exception("journal: a record could not be encoded")
            self._drop("record")
            return
        with self._lock:
            try:
                os.write(self._fd, line)
            except OSError:
                logger.exception("journal: append failed")
                self._drop("record")
                return
            self.size += len(line)
            self.appended += 1

    def _slim(self, record: dict[str, Any]) -> dict[str, Any]:
        slim = dict(record)
        for key in _BULKY:
            if slim.pop(key, None):
                self._drop(key)
        findings = slim.get("findings")
        if isinstance(findings, list) and any(isinstance(f, dict) and f.get("fragment") for f in findings):
            slim["findings"] = [{**f, "fragment": ""} for f in findings]
            self._drop("fragment")
        return slim

    def _drop(self, what: str) -> None:
        self.dropped[what] = self.dropped.get(what, 0) + 1
        from infra import metrics

        metrics.JOURNAL_DROPPED.labels(what=what).inc()

    def fsync(self) -> None:
        """Flush appended records to disk (the writer calls it every ``JOURNAL_FSYNC_SECONDS``)."""
        os.fsync(self._fd)

    def mark_drained(self, offset: int) -> None:
        """The database has every record up to ``offset``; empty the file once it has all of them."""
        with self._lock:
            self.drained = max(self.drained, offset)
            if self.drained == self.size and self.size > (1 << 20):
                os.ftruncate(self._fd, 0)
                self.size = self.drained = 0
                write_offset(self.path, 0)
                return
        write_offset(self.path, offset)

    def refresh_drained(self) -> int:
        """A shared journal: take the offset its writer process committed (the ``.offset`` sidecar); returns the
        backlog in bytes. Never touches the database (a small file read)."""
        offset = read_offset(self.path)
        with self._lock:
            if offset <= self.size:
                self.drained = max(self.drained, offset)
            return self.size - self.drained

    def rotate(self, *, threshold: int = 1 << 20) -> bool:
        """A shared journal the database has entirely and that is past ``threshold`` bytes: go on in a new file
        and delete this one (the writer process has committed every record of it, so nothing is lost; it
        forgets a file that is gone). True when it rotated. Bounds the disk as ``mark_drained``'s truncation."""
        with self._lock:
            if self._fd < 0 or self.drained != self.size or self.size <= threshold:
                return False
            old_path, old_fd = self.path, self._fd
            self._generation += 1
            path = self._name()
            try:
                self._fd = self._open(path)
            except OSError:
                logger.exception("journal: cannot open a new file; %s keeps growing", old_path.name)
                return False
            self.path = path
            self.size = self.drained = 0
        old_path.unlink(missing_ok=True)  # the journal first: a writer never sees a journal without its offset
        old_path.with_suffix(".offset").unlink(missing_ok=True)
        os.close(old_fd)
        return True

    def close(self) -> None:
        """Release the file (its lock goes with it: a later process may drain what is left)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def lock_orphan(path: Path) -> int | None:
    """An fd holding ``path``'s lock when no live process holds it (its owner died), else None."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
