"""A private Postgres cluster for tests that stop, freeze and restart their database.

Never the CI's own server: ``initdb`` in a temporary folder, run as the ``postgres`` user, on a free
port; ``stop`` / ``start`` / ``freeze`` (SIGSTOP of the postmaster and every backend) / ``thaw``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

AS_POSTGRES = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """One cluster in ``folder`` (created with initdb on first ``start``); ``url`` of its ``toolrelay`` database."""

    def __init__(self, folder: Path) -> None:
        self.data = folder / "pgdata"
        self.log = folder / "postgres.log"
        self.port = _free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/toolrelay"
        self.process: subprocess.Popen[bytes] | None = None
        folder.chmod(0o755)
        self.data.mkdir()
        shutil.chown(self.data, "postgres", "postgres")
        subprocess.run([*AS_POSTGRES, "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",  # noqa: S603
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True)

    def start(self) -> None:
        """Start the server and wait until it accepts connections (creating the database the first time)."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - fixed argv
                [*AS_POSTGRES, "postgres", "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port),
                 "-k", str(self.data), "-c", "max_connections=60", "-c", "fsync=off"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)],  # noqa: S603, S607
                             check=False).returncode != 0:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"private Postgres did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        subprocess.run(["createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",  # noqa: S603, S607
                        "toolrelay"], check=False, capture_output=True)

    def stop(self) -> None:
        """A fast shutdown (clients see their connections closed); a cluster left frozen is thawed first, and one
        that does not stop within 30 s is killed, so a failed test never leaves a server or a zombie behind."""
        if self.process is not None and self.process.poll() is None:
            self.thaw(self._pids())
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.process = None

    def _master(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def _children(self, master: int) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True,  # noqa: S603, S607
                             check=False).stdout.split()
        return [int(pid) for pid in out]

    def _pids(self) -> list[int]:
        master = self._master()
        return [] if master is None else [master, *self._children(master)]

    @staticmethod
    def _signal(pids: list[int], sig: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # a backend that ended since it was listed
                os.kill(pid, sig)

    def freeze(self) -> list[int]:
        """SIGSTOP every process of the cluster: its kernel keeps accepting and acknowledging, nothing answers.

        The postmaster first, so it forks no backend while its children are listed; a child that exits between
        the listing and its signal is skipped. Returns the pids stopped, for ``thaw``."""
        master = self._master()
        if master is None:
            raise RuntimeError("the private Postgres is not running")
        os.kill(master, signal.SIGSTOP)
        children = self._children(master)
        try:
            self._signal(children, signal.SIGSTOP)
        except BaseException:
            self._signal([master, *children], signal.SIGCONT)
            raise
        return [master, *children]

    def thaw(self, pids: list[int]) -> None:
        """SIGCONT ``pids`` (those still alive)."""
        self._signal(pids, signal.SIGCONT)

    def sql(self, query: str) -> list[tuple[object, ...]]:
        """Rows of ``query`` (psql, so the test process holds no connection of its own)."""
        out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d",  # noqa: S603, S607
                              "toolrelay", "-At", "-F", "\t", "-c", query], capture_output=True, text=True,
                             check=True).stdout
        return [tuple(line.split("\t")) for line in out.splitlines() if line]
