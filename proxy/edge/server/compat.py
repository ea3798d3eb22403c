"""Which Daphne the launcher's subclasses were written for, checked before anything is served.

The subclasses in ``protocol`` and ``launcher`` override methods of Daphne's ``Server`` and
``WebRequest`` and of Twisted's ``HTTPChannel`` and ``Request`` whose behaviour was read in Daphne
4.1.0 to 4.2.3 (``daphne/server.py``, ``daphne/http_protocol.py``: unchanged between them but for
header-value validation) and Twisted 24.10 to 26.10 (``twisted/web/http.py``). Another Daphne major
version may move any of them, so the launcher refuses to start rather than serve without its limits.
"""

from __future__ import annotations

import re

#: Daphne versions the launcher supports: ``>= 4.1, < 5`` (pyproject.toml's range).
SUPPORTED_DAPHNE = ((4, 1), (5, 0))

#: The attributes the subclasses override or call, by the class that must have them.
HOOKS = {
    "daphne.server.Server": ("run", "create_application", "stop"),
    "daphne.http_protocol.WebRequest": ("process", "handle_reply", "finish", "connectionLost"),
    "daphne.http_protocol.HTTPFactory": ("buildProtocol",),
    "twisted.web.http.HTTPChannel": ("connectionMade", "dataReceived", "allHeadersReceived", "rawDataReceived",
                                     "requestDone", "connectionLost", "loseConnection", "setTimeout", "length"),
    "twisted.web.http.Request": ("handleContentChunk", "requestReceived", "registerProducer",
                                 "unregisterProducer", "setResponseCode"),
}


class UnsupportedServer(RuntimeError):
    """The installed Daphne (or Twisted) is not one the launcher was written for."""


def parse_version(text: str) -> tuple[int, int]:
    """``"4.2.3"`` -> ``(4, 2)``; ``(0, 0)`` when there are not two numbers."""
    numbers = [int(n) for n in re.findall(r"\d+", text)[:2]]
    return (numbers[0], numbers[1]) if len(numbers) == 2 else (0, 0)


def check_supported(daphne_version: str | None = None) -> None:
    """Raise ``UnsupportedServer`` unless Daphne ``daphne_version`` (default: the installed one) is in
    ``SUPPORTED_DAPHNE`` and every attribute in ``HOOKS`` exists. Imports no Twisted reactor."""
    import importlib

    if daphne_version is None:
        import daphne

        daphne_version = str(daphne.__version__)
    low, high = SUPPORTED_DAPHNE
    if not low <= parse_version(daphne_version) < high:
        raise UnsupportedServer(
            f"toolrelay's launcher (manage.py serve) supports Daphne >=4.1,<5; Daphne {daphne_version} is "
            "installed. Install a supported Daphne (pip install 'daphne>=4.1,<5'), or serve with plain "
            "`daphne config.asgi:application`, which runs without the launcher's limits and backpressure.")
    missing = []
    for path, names in HOOKS.items():
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name, None)
        missing += [f"{path}.{attr}" for attr in names if cls is None or not hasattr(cls, attr)]
    if missing:
        raise UnsupportedServer(f"toolrelay's launcher cannot hook this Daphne/Twisted: missing {', '.join(missing)}.")
