"""``serve()``: Daphne's ``Server`` with the launcher's HTTP classes, scope extension and listen backlog.

Imported only to serve: importing Daphne's server module installs Twisted's asyncio reactor, which
has to happen before anything imports ``twisted.internet.reactor`` (as ``daphne.cli`` does).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from daphne.server import Server  # isort: skip - first: installs Twisted's asyncio reactor
from daphne.access import AccessLogGenerator
from django.conf import settings
from twisted.internet import reactor as _reactor

from proxy.edge.server.backpressure import EXTENSION
from proxy.edge.server.compat import check_supported
from proxy.edge.server.listen import endpoint_strings
from proxy.edge.server.protocol import LimitedHTTPFactory, Limits

logger = logging.getLogger(__name__)
reactor: Any = _reactor  # Twisted's interface stubs type its methods unbound


class LimitedServer(Server):  # type: ignore[misc]  # Daphne is untyped
    """Daphne's server serving ``LimitedHTTPFactory`` and the ``toolrelay.backpressure`` extension.

    ``Server.run`` builds its HTTP factory inline (``self.http_factory = HTTPFactory(self)``, Daphne
    4.1 to 4.2.3) and has no hook for another class, so ``http_factory`` is a property whose setter
    puts ``LimitedHTTPFactory`` in place of Daphne's: the rest of ``run`` (listening, timeouts,
    application checks, shutdown) stays Daphne's own.
    """

    def __init__(self, application: Any, *, limits: Limits, **kwargs: Any) -> None:
        self.limits = limits
        self._http_factory: LimitedHTTPFactory | None = None
        super().__init__(application, **kwargs)

    @property
    def http_factory(self) -> LimitedHTTPFactory | None:
        """The HTTP factory ``run`` listens with (always a ``LimitedHTTPFactory``)."""
        return self._http_factory

    @http_factory.setter
    def http_factory(self, factory: Any) -> None:
        if not isinstance(factory, LimitedHTTPFactory):
            factory = LimitedHTTPFactory(self, self.limits)
        self._http_factory = factory

    def run(self) -> None:
        """Daphne's ``run`` with our SIGTERM / SIGINT handling instead of Twisted's (see ``drain``)."""
        self.signal_handlers = False
        self._ports: list[Any] = []
        self._draining = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: reactor.callFromThread(self.drain))
        super().run()

    def listen_success(self, port: Any) -> None:
        """Daphne's, keeping the listening port so ``drain`` can close it."""
        self._ports.append(port)
        super().listen_success(port)

    def drain(self) -> None:
        """Stop accepting, let open requests end within ``SHUTDOWN_GRACE_SECONDS``, then stop (the journal
        is flushed at exit). A second signal stops at once; requests cut then are ``interrupted``."""
        if self._draining:
            logger.warning("second stop signal: stopping now")
            self.stop()
            return
        self._draining = True
        for port in self._ports:
            port.stopListening()
        grace = float(settings.SHUTDOWN_GRACE_SECONDS)
        logger.warning("stop signal: not accepting; waiting up to %g s for %d open request(s)", grace, self.busy())
        self._wait_idle(time.monotonic() + grace)

    def busy(self) -> int:
        """Requests whose application is still running."""
        return sum(1 for details in self.connections.values()
                   if "disconnected" not in details and details.get("application_instance") is not None
                   and not details["application_instance"].done())

    def _wait_idle(self, deadline: float) -> None:
        left = self.busy()
        if left == 0 or time.monotonic() >= deadline:
            if left:
                logger.warning("grace period over: %d request(s) cut (audited as interrupted)", left)
            self.stop()
            return
        reactor.callLater(0.1, self._wait_idle, deadline)

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        """Daphne's, with ``scope["extensions"]["toolrelay.backpressure"]`` for the request's producer."""
        backpressure = getattr(protocol, "backpressure", None)
        if backpressure is not None:
            scope["extensions"] = {**scope.get("extensions", {}), EXTENSION: backpressure}
        return super().create_application(protocol, scope)


def serve(application: Callable[..., Any], *, host: str | None, port: int | None, fd: int | None,
          limits: Limits, backlog: int, proxy_headers: bool = False, access_log: bool = True,
          verbosity: int = 1) -> int:
    """Serve ``application`` until the reactor stops (SIGINT / SIGTERM); return the exit status (1 when
    listening failed). ``UnsupportedServer`` for a Daphne the launcher was not written for; ``OSError``
    when ``fd`` is not a listening socket."""
    check_supported()
    # The event loop (the byte path) shares the GIL with the journal writer's and the auth lookups'
    # threads; with Python's default 5 ms switch interval a writer batch of ORM work holds the loop off for
    # up to 5 ms at a time. Measured with `make bench` (latency, throughput phases, same run vs 5 ms):
    # added TTFT p50 5.47 -> 4.46 ms, p99 17.2 -> 14.8 ms, streamed req/s at c=64 287 -> 416.
    sys.setswitchinterval(settings.GIL_SWITCH_INTERVAL_SECONDS)
    server = LimitedServer(
        application,
        limits=limits,
        endpoints=endpoint_strings(host=host, port=port, fd=fd, backlog=backlog),
        action_logger=AccessLogGenerator(sys.stdout) if access_log else None,
        verbosity=verbosity,
        proxy_forwarded_address_header="X-Forwarded-For" if proxy_headers else None,
        proxy_forwarded_port_header="X-Forwarded-Port" if proxy_headers else None,
        proxy_forwarded_proto_header="X-Forwarded-Proto" if proxy_headers else None,
    )
    server.run()
    return 1 if server.abort_start else 0
