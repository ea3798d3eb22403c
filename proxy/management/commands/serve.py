"""``manage.py serve --host H --port P [--fd N]``: toolrelay under its own Daphne launcher.

Daphne plus what has to live below ASGI (``proxy.edge.server``): the request body limit checked as the
body arrives (``MAX_REQUEST_BYTES``), backpressure from the client's socket to the relay, the
listen backlog (``LISTEN_BACKLOG``) and the request-header deadline (``HEADER_TIMEOUT_SECONDS``).
Plain ``daphne config.asgi:application`` still works, without them (docs/deployment.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

if TYPE_CHECKING:
    from proxy.edge.server.protocol import Limits

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


class Command(BaseCommand):
    help = ("Serve toolrelay (config.asgi) with Daphne plus early request limits, backpressure, the listen "
            "backlog and the header deadline. Binds --host/--port (default 127.0.0.1:8000) and/or --fd.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=None, help=f"address to bind (default {DEFAULT_HOST})")
        parser.add_argument("--port", type=int, default=None, help=f"TCP port (default {DEFAULT_PORT} without --fd)")
        parser.add_argument("--fd", type=int, default=None,
                            help="serve on this inherited listening socket (e.g. 3 from systemd)")
        parser.add_argument("--proxy-headers", action="store_true",
                            help="take the client address and scheme from X-Forwarded-For/-Port/-Proto")
        parser.add_argument("--no-access-log", action="store_true", help="no access log line per request on stdout")

    def handle(self, *args: Any, **options: Any) -> None:
        from proxy.edge.server.compat import UnsupportedServer, check_supported

        try:
            check_supported()
        except UnsupportedServer as exc:
            raise CommandError(str(exc)) from None
        from proxy.edge.server.launcher import serve  # installs Twisted's asyncio reactor

        host, port, fd = _listen_on(options)
        limits, backlog = _limits()

        from channels.routing import get_default_application

        from audit import journal_writer

        mode = writer_mode()
        supervisor = _start_writer(mode)
        where = ", ".join([*([f"http://{host}:{port}"] if port is not None else []),
                           *([f"fd {fd}"] if fd is not None else [])])
        self.stdout.write(f"toolrelay serving on {where} (MAX_REQUEST_BYTES={limits.max_request_bytes}, "
                          f"HEADER_TIMEOUT_SECONDS={limits.header_timeout:g}, LISTEN_BACKLOG={backlog}, "
                          f"JOURNAL_WRITER={mode})")
        self.stdout.flush()
        try:
            status = serve(get_default_application(), host=host, port=port, fd=fd, limits=limits, backlog=backlog,
                           proxy_headers=options["proxy_headers"], access_log=not options["no_access_log"],
                           verbosity=options["verbosity"])
        except OSError as exc:
            raise CommandError(f"cannot listen on {where}: {exc}") from None
        finally:
            if supervisor is not None:
                journal_writer.shutdown()  # release the journal first: the writer's last drain takes all of it
                supervisor.stop()
        if status:
            raise CommandError(f"could not listen on {where} (see the log above)")


def _listen_on(options: dict[str, Any]) -> tuple[str | None, int | None, int | None]:
    """``(host, port, fd)`` from the options: the default port when neither a port nor an fd is given;
    ``CommandError`` for ``--host`` without ``--port``."""
    host, port, fd = options["host"], options["port"], options["fd"]
    if port is None and fd is None:
        port = DEFAULT_PORT
    if port is not None:
        host = host or DEFAULT_HOST
    elif host is not None:
        raise CommandError("--host needs --port")
    return host, port, fd


def _start_writer(mode: str) -> Any:
    """Start the journal and its writer for ``mode`` (``writer_mode()``); the supervisor of a writer child
    process (``mode == "process"``), else None. Without a broker (no beat) and with the writer in this
    process, the alert rules are evaluated here too (else by the writer process)."""
    from audit import journal_writer

    journal_writer.configure(shared=mode != "thread")
    journal_writer.journal()  # the writer starts now: it drains journals stopped processes left
    if mode == "thread":
        from alerts import ticker

        ticker.start()
    if mode != "process":
        return None
    from audit.host_writer import Supervisor

    supervisor = Supervisor()
    supervisor.start()
    return supervisor


def writer_mode() -> str:
    """``JOURNAL_WRITER`` resolved: ``process``, ``external`` or ``thread`` (``auto``: ``process`` with
    ``REDIS_URL``, whose channel layer carries the writer's live feed to this process, else ``thread``);
    ``CommandError`` for another value."""
    mode = settings.JOURNAL_WRITER.strip().lower()
    if mode == "auto":
        return "process" if settings.REDIS_URL else "thread"
    if mode not in ("process", "external", "thread"):
        raise CommandError(f"JOURNAL_WRITER={settings.JOURNAL_WRITER!r} must be auto, process, external or thread")
    return mode


def _limits() -> tuple[Limits, int]:
    """The launcher's ``Limits`` and the backlog from settings; ``CommandError`` on values out of range."""
    from proxy.edge.server.protocol import Limits

    if settings.MAX_REQUEST_BYTES < 1:
        raise CommandError(f"MAX_REQUEST_BYTES={settings.MAX_REQUEST_BYTES} must be at least 1")
    if settings.HEADER_TIMEOUT_SECONDS < 0:
        raise CommandError(f"HEADER_TIMEOUT_SECONDS={settings.HEADER_TIMEOUT_SECONDS} must be 0 (off) or more")
    if settings.LISTEN_BACKLOG < 1:
        raise CommandError(f"LISTEN_BACKLOG={settings.LISTEN_BACKLOG} must be at least 1")
    limits = Limits(max_request_bytes=settings.MAX_REQUEST_BYTES, header_timeout=settings.HEADER_TIMEOUT_SECONDS)
    return limits, settings.LISTEN_BACKLOG
