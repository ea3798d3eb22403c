"""``manage.py journal_writer [--parent PID]``: the host's audit journal writer process (``audit.host_writer``).

``manage.py serve`` starts one itself with ``JOURNAL_WRITER=process`` (with ``--parent``, restarted when it
dies); a deployment that wants it separate sets ``JOURNAL_WRITER=external`` on its serve processes and runs
this once per host (per ``JOURNAL_DIR``), e.g. as its own systemd unit or container (docs/deployment.md).
A second one on the same folder stands by until the first stops. SIGTERM / SIGINT: a last bounded drain, exit 0.
The command lives in the alerts app because it also runs the alert rules (``alerts.ticker``), a layer above the
audit it drains (tests/test_architecture.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = ("Move every serving process's audit journal in JOURNAL_DIR into the database (one per host); "
            "drain stopped processes' journals, detect incidents, publish the live feed.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--parent", type=int, default=None,
                            help="exit (after a last drain) when this process is gone (serve's own child)")
        parser.add_argument("--ready-fd", type=int, default=None,
                            help="write one byte to this inherited pipe once signals are handled (serve's child)")

    def handle(self, *args: Any, **options: Any) -> None:
        from alerts import ticker
        from audit import host_writer

        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        if options["ready_fd"] is not None:
            with contextlib.suppress(OSError):
                os.write(options["ready_fd"], b"1")
                os.close(options["ready_fd"])
        ticker.start()  # without a broker (no beat), the alert rules are evaluated here, not in serve
        host_writer.run(stop, parent=options["parent"])
