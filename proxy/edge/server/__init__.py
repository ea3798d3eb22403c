"""toolrelay's own Daphne launcher (``python manage.py serve``): protections that live below ASGI.

Twisted hands Daphne a request only once its whole body has arrived, and Daphne's ``send`` returns
before the bytes have left the process, so neither a body limit nor flow control can be built in the
ASGI app. This package subclasses Daphne's server, HTTP factory and request (and Twisted's
``HTTPChannel``) for the pinned Daphne range:

- ``backpressure``: the ``toolrelay.backpressure`` ASGI scope extension, a push producer on the
  request whose ``wait_writable()`` the relay awaits before each upstream read;
- ``protocol``: the body length checked as it arrives (413 before it is buffered), a deadline for
  the request headers (slowloris), the 1 MiB write high-water mark;
- ``launcher``: the listen backlog, the supported-version check, ``serve()``.

Plain ``daphne config.asgi:application`` keeps working without any of this (docs/deployment.md).
Modules here import Daphne's server module (which installs Twisted's asyncio reactor) only from
``launcher``; ``backpressure`` imports no Twisted reactor code at all.
"""
