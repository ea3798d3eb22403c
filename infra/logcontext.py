"""Log lines that join a request's trace: its request id, trace id and span id on every record.

``bind(request_id=..., trace_id=..., span_id=...)`` is called once per request by
``proxy.telemetry.spans.start_request`` in the request's own task; :class:`ContextFilter` (installed on
the console handler by ``config.settings.LOGGING``) copies the values onto each record of that task
(``record.request_id`` etc., ``""`` outside a request). Two formatters:

- :class:`PlainFormatter` (``LOG_FORMAT=plain``, the default): the usual line, then
  `` request_id=… trace_id=… span_id=…`` when a request is bound;
- :class:`JsonFormatter` (``LOG_FORMAT=json``): one JSON object per line, ``ts`` (ISO 8601 UTC),
  ``level``, ``logger``, ``message``, the ids when bound, ``exc`` for a traceback.

The message text is whatever the code logged: the request path never logs client or upstream
content, and upstream secrets go through ``infra.scrub`` before they are logged.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging

_FIELDS = ("request_id", "trace_id", "span_id")
_context: contextvars.ContextVar[tuple[str, str, str]] = contextvars.ContextVar("toolrelay_log_context",
                                                                                 default=("", "", ""))


def bind(*, request_id: str = "", trace_id: str = "", span_id: str = "") -> None:
    """Bind the current task's log context (a request's ids; ``""``: none)."""
    _context.set((request_id, trace_id, span_id))


def current() -> dict[str, str]:
    """The bound ids, e.g. ``{"request_id": "…", "trace_id": "…", "span_id": "…"}`` (only those set)."""
    return {k: v for k, v in zip(_FIELDS, _context.get(), strict=True) if v}


class ContextFilter(logging.Filter):
    """Sets ``request_id``, ``trace_id`` and ``span_id`` on every record (``""`` when unbound); never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Annotate ``record``; always True."""
        for name, value in zip(_FIELDS, _context.get(), strict=True):
            if not getattr(record, name, ""):
                setattr(record, name, value)
        return True


def _ids(record: logging.LogRecord) -> dict[str, str]:
    return {name: value for name in _FIELDS if (value := getattr(record, name, "") or "")}


class PlainFormatter(logging.Formatter):
    """``%(asctime)s %(levelname)s %(name)s %(message)s``, then the request's ids when it has them."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The line, with `` request_id=… trace_id=… span_id=…`` appended inside a request."""
        text = super().format(record)
        ids = _ids(record)
        if not ids:
            return text
        suffix = " ".join(f"{k}={v}" for k, v in ids.items())
        head, newline, rest = text.partition("\n")  # before a traceback, so the line stays greppable
        return f"{head} {suffix}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (``LOG_FORMAT=json``): ts, level, logger, message, the ids, exc."""

    def format(self, record: logging.LogRecord) -> str:
        """``record`` as one line of JSON."""
        stamp = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        line: dict[str, object] = {"ts": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                   "level": record.levelname, "logger": record.name, "message": record.getMessage(),
                                   **_ids(record)}
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)
