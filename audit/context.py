"""Template context for the admin: the audit journal's state, for a banner on every page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def journal_state(request: HttpRequest) -> dict[str, Any]:
    """``journal_problem``: a sentence when this process's audit journal is not draining into the database
    (the database is down, or a backlog waits), else nothing. Staff pages only; never touches the database."""
    if not request.path.startswith("/admin/") or not getattr(request.user, "is_staff", False):
        return {}
    from audit.journal_writer import writer

    running = writer()
    if running is None:
        return {}
    status = running.status()
    if status.database != "down" and status.backlog < 1 << 20:
        return {}
    backlog = f"{status.backlog / (1 << 20):.1f} MB" if status.backlog >= 1 << 20 else f"{status.backlog:,} bytes"
    problem = (f"The audit journal is not draining into the database ({status.error or 'database down'}): "
               f"{backlog} kept on disk and written as soon as the database answers. The proxy keeps serving.")
    if status.dropped:
        problem += f" {status.dropped} journal part(s) were dropped at its bound."
    return {"journal_problem": problem}
