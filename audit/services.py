"""Audit writes (STYLE.md rule 8): records appended to the journal on the byte path, written in batches.

The relay builds plain records in memory and appends them at once to this process's journal
(``audit.journal``): ``request_started`` when a request is understood, ``attempt_finished`` when an
upstream call ends (so a corrupted attempt is on record before its retry starts), ``request_finished``
when the response has ended. The upstream client appends ``limit_learned`` when it learns what an
upstream refuses (``proxy.upstreams.learned``); the writer keeps it as the ``UpstreamLearnedLimit`` row of its
upstream, model and parameter (the one learned last wins; an admin's later edit is kept).
Appending is a few microseconds and never raises or waits for the database. The journal writer
(``audit.journal_writer``) hands batches of records to ``journal_batch_write``, which writes them in
one transaction, idempotently: request rows are
keyed by the request id, attempts by (request, number), so replaying a batch never duplicates a
row. Nothing here ever sees request headers or credentials.
"""

from __future__ import annotations

import base64
import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db import connections, models, transaction
from django.utils import timezone

from audit.models import Attempt, Finding, Fragment, ProxyRequest

# ----- the byte path: records into the journal -----



# ----- the writer: batches into the database -----

def db_text(value: Any) -> str:
    """``value`` as text Postgres accepts: NUL bytes written ``\\x00`` and unpaired surrogates (undecodable
    upstream bytes) as backslash escapes, so a row is never lost to what the upstream sent."""
    text = value if isinstance(value, str) else str(value)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _when(stamp: Any) -> datetime:
    return datetime.fromtimestamp(float(stamp), tz=UTC) if isinstance(stamp, int | float) else timezone.now()


def _request_row(rid: str, req: dict[str, Any], res: dict[str, Any] | None) -> ProxyRequest:
    row = ProxyRequest(
        id=uuid.UUID(rid), tenant_id=req["tenant_id"], api_key_id=req.get("api_key_id"), route_id=req.get("route_id"),
        upstream_id=req.get("upstream_id"), client_protocol=db_text(req.get("client_protocol", "")),
        client_user_agent=db_text(req.get("client_user_agent", "")), model=db_text(req.get("model", "")),
        upstream_model=db_text(req.get("upstream_model", "")), path=req.get("path", ""),
        created=_when(req.get("created")), member_id=_member_id(req.get("member_id")),
        member_username=db_text(req.get("member_username") or "")[:150],
    )
    if res is not None:
        _apply_result(row, res)
    return row


def _member_id(value: Any) -> int | None:
    """A journaled member id (records written before members carry none)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


_RESULT_FIELDS = ("outcome", "status", "attempts", "ttft_ms", "total_ms", "prompt_tokens", "completion_tokens",
                  "wasted_completion_tokens", "wasted_ms", "cache_read_tokens", "cache_write_tokens",
                  "reasoning_tokens", "usage_estimated", "unpriced", "cost_usd", "delivered_usd", "wasted_usd",
                  "delivered", "error", "finished")
#: Token columns of a result or attempt record: whole numbers 0..2**31-1 (anything else is stored as 0).
_COUNTS = frozenset({"prompt_tokens", "completion_tokens", "wasted_completion_tokens", "cache_read_tokens",
                     "cache_write_tokens", "reasoning_tokens"})
_MONEY = frozenset({"cost_usd", "delivered_usd", "wasted_usd"})
_MAX_COUNT = 2**31 - 1
_MAX_USD = Decimal("9999999999")


def _count(value: Any) -> int:
    """A token column's value: a whole number within the column, else 0 (a record never breaks the batch)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT else 0


def _usd(value: Any) -> Decimal | None:
    """A money column's value (10 decimal places) from a journal float; None when absent or not a sane amount."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        return None
    amount = Decimal(repr(float(value))).quantize(Decimal("1e-10"))
    return amount if amount <= _MAX_USD else None


def _apply_result(row: ProxyRequest, res: dict[str, Any]) -> None:
    for name in _RESULT_FIELDS[:-3]:
        if name in res:
            setattr(row, name, res[name])
    for name in _COUNTS & res.keys():
        setattr(row, name, _count(res[name]))
    row.usage_estimated, row.unpriced = res.get("usage_estimated") is True, res.get("unpriced") is True
    row.delivered_usd = _usd(res.get("delivered_usd")) or Decimal(0)
    row.wasted_usd = _usd(res.get("wasted_usd")) or Decimal(0)
    row.cost_usd = row.delivered_usd + row.wasted_usd
    delivered = res.get("delivered")
    row.delivered = _db_json(delivered) if isinstance(delivered, dict) else None
    row.error = db_text(res.get("error", ""))
    row.finished = _when(res.get("finished"))


def _db_json(value: Any) -> Any:
    """``value`` (decoded JSON) with every string made acceptable to Postgres (``db_text``)."""
    if isinstance(value, str):
        return db_text(value)
    if isinstance(value, dict):
        return {db_text(k): _db_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_db_json(v) for v in value]
    return value


@dataclass(slots=True)
class Batch:
    """Journal records grouped for one transaction: the latest start and finish per request, attempts in order."""

    starts: dict[str, dict[str, Any]] = field(default_factory=dict)
    finishes: dict[str, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # request-level findings by request
    end_notes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # ... decided at the request's end
    learned: list[dict[str, Any]] = field(default_factory=list)  # learned upstream limits, in journal order

    @classmethod
    def of(cls, records: Iterable[dict[str, Any]]) -> Batch:
        """Group ``records`` (journal lines of any type; unknown types are ignored)."""
        batch = cls()
        for record in records:
            kind, rid = record.get("t"), record.get("id")
            if kind == "learned" and isinstance(record.get("fact"), dict):
                batch.learned.append(record["fact"])
                continue
            if not isinstance(rid, str):
                continue
            if kind == "start":
                batch.starts[rid] = record["req"]
                if record.get("findings"):
                    batch.notes[rid] = record["findings"]
            elif kind == "finish":
                batch.finishes[rid] = (record["req"], record["res"])
                if record.get("findings"):
                    batch.end_notes[rid] = record["findings"]
            elif kind == "attempt":
                batch.attempts.append(record)
        return batch

    @property
    def ids(self) -> set[str]:
        return set(self.starts) | set(self.finishes) | {a["id"] for a in self.attempts}


def journal_batch_write(batch: Batch) -> int:
    """Write ``batch`` in one transaction, idempotently; returns the attempts skipped because their request
    row is unknown (their start record was dropped at the journal's bound)."""
    with transaction.atomic():
        known, created = _requests(batch)
        skipped = _attempts(batch, known, created)
        _learned(batch.learned)
        return skipped


def _requests(batch: Batch) -> tuple[set[str], set[str]]:
    """Insert the batch's new request rows, finish the existing ones; ``(known ids, ids created now)``."""
    ids = batch.ids
    existing = {str(i) for i in ProxyRequest.objects.filter(id__in=[uuid.UUID(i) for i in ids])
                .values_list("id", flat=True)}
    new = [_request_row(rid, *(batch.finishes[rid] if rid in batch.finishes else (batch.starts[rid], None)))
           for rid in sorted(ids - existing) if rid in batch.finishes or rid in batch.starts]
    _known_members(new)
    ProxyRequest.objects.bulk_create(new)
    Finding.objects.bulk_create([_request_finding(row, f) for row in new
                                 for f in (*batch.notes.get(str(row.id), ()), *batch.end_notes.get(str(row.id), ()))])
    _end_notes(batch, existing)
    updated = []
    for rid in sorted(set(batch.finishes) & existing):
        row = ProxyRequest(id=uuid.UUID(rid))
        _apply_result(row, batch.finishes[rid][1])
        updated.append(row)
    if updated:
        _update_results(updated)
    created = {str(r.id) for r in new}
    return existing | created, created


def _known_members(rows: list[ProxyRequest]) -> None:
    """Unlink members deleted since their request was journaled (the user name snapshot stays); one query,
    none when no row has a member."""
    wanted = {row.member_id for row in rows if row.member_id is not None}
    if not wanted:
        return
    from tenants.models import Membership

    alive = set(Membership.objects.filter(pk__in=wanted).values_list("pk", flat=True))
    for row in rows:
        if row.member_id is not None and row.member_id not in alive:
            row.member_id = None


def _end_notes(batch: Batch, existing: set[str]) -> None:
    """The end findings of requests whose row exists and is not finished yet (a replayed finish adds none)."""
    ids = [uuid.UUID(rid) for rid in batch.end_notes if rid in existing and rid in batch.finishes]
    if not ids:
        return
    open_rows = ProxyRequest.objects.filter(id__in=ids, finished__isnull=True).values_list("id", "tenant_id", "created")
    Finding.objects.bulk_create([_request_finding(ProxyRequest(id=rid, tenant_id=tenant, created=created), f)
                                 for rid, tenant, created in open_rows for f in batch.end_notes[str(rid)]])


def _update_results(rows: list[ProxyRequest]) -> None:
    """Write the result fields of ``rows`` (requests whose pending row an earlier batch wrote).

    One parameterised ``UPDATE ... WHERE id = %s`` run with ``executemany`` (psycopg pipelines it), the
    values prepared by the fields themselves, so it is the same on Postgres and SQLite. Django's
    ``bulk_update`` builds a ``CASE WHEN`` expression per field and row instead: measured in the journal
    writer, two thirds of its CPU (about 0.4 ms per streamed request, docs/benchmarks.md).
    """
    connection = connections[ProxyRequest.objects.db]
    quote = connection.ops.quote_name
    meta = ProxyRequest._meta
    fields = [field for name in _RESULT_FIELDS if isinstance(field := meta.get_field(name), models.Field)]
    pk = meta.pk
    assert pk is not None and pk.column is not None
    sql = (f"UPDATE {quote(meta.db_table)} SET "  # noqa: S608 - quoted names of our own columns
           + ", ".join(f"{quote(str(f.column))} = %s" for f in fields) + f" WHERE {quote(pk.column)} = %s")
    params = [[f.get_db_prep_save(getattr(row, f.attname), connection) for f in fields]
              + [pk.get_db_prep_value(row.pk, connection)] for row in rows]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _attempts(batch: Batch, known: set[str], created: set[str]) -> int:
    pending = [a for a in batch.attempts if a["id"] in known]
    older = {a["id"] for a in pending} - created  # a request created in this batch has no attempt row yet
    have = set(Attempt.objects.filter(request_id__in=[uuid.UUID(i) for i in older])
               .values_list("request_id", "number")) if older else set()
    fresh = [a for a in pending if (uuid.UUID(a["id"]), a["number"]) not in have]
    rows = Attempt.objects.bulk_create([_attempt_row(a) for a in fresh])
    Finding.objects.bulk_create([_finding_row(a, row, f) for a, row in zip(fresh, rows, strict=True)
                                 for f in a.get("findings", ())])
    Fragment.objects.bulk_create([_fragment_row(a, row) for a, row in zip(fresh, rows, strict=True) if a.get("body")])
    return len(batch.attempts) - len(pending)


def _attempt_row(a: dict[str, Any]) -> Attempt:
    return Attempt(
        request_id=uuid.UUID(a["id"]), number=a["number"], upstream_id=a.get("upstream_id"),
        upstream_model=db_text(a.get("upstream_model", "")), upstream_status=a.get("upstream_status"),
        outcome=a.get("outcome", ""), abort_reason=db_text(a.get("abort_reason", "")), ttfb_ms=a.get("ttfb_ms"),
        duration_ms=a.get("duration_ms"), prompt_tokens=_count(a.get("prompt_tokens", 0)),
        completion_tokens=_count(a.get("completion_tokens", 0)), bytes_received=a.get("bytes_received", 0),
        frames=a.get("frames", 0), created=_when(a.get("created")),
        cache_read_tokens=_count(a.get("cache_read_tokens")), cache_write_tokens=_count(a.get("cache_write_tokens")),
        reasoning_tokens=_count(a.get("reasoning_tokens")), usage_estimated=a.get("usage_estimated") is True,
        cost_usd=_usd(a.get("cost_usd")),
    )


def _finding_row(a: dict[str, Any], row: Attempt, f: dict[str, Any]) -> Finding:
    return Finding(
        request_id=row.request_id, attempt=row, tenant_id_copy=a["tenant_id"], kind=str(f["kind"])[:64],
        severity=str(f["severity"])[:8], action=str(f["action"])[:12], choice=f.get("choice"),
        slot=f.get("slot"), frame=f.get("frame"), byte_offset=f.get("offset"), fragment=db_text(f.get("fragment", "")),
        detail=db_text(f.get("detail", "")), tool_name=db_text(f.get("tool", ""))[:200], created=row.created,
    )


def _request_finding(row: ProxyRequest, f: dict[str, Any]) -> Finding:
    return Finding(request_id=row.id, attempt=None, tenant_id_copy=row.tenant_id, kind=str(f["kind"])[:64],
                   severity=str(f["severity"])[:8], action=str(f["action"])[:12], detail=db_text(f.get("detail", "")),
                   created=row.created)


def _fragment_row(a: dict[str, Any], row: Attempt) -> Fragment:
    body = base64.b64decode(a["body"]).decode("utf-8", "backslashreplace")
    return Fragment(attempt=row, tenant_id_copy=a["tenant_id"], body=db_text(body),
                    truncated=bool(a.get("truncated")), created=row.created)


def _learned(records: list[dict[str, Any]]) -> None:
    """Keep each (upstream, model, parameter) fact learned last, unless its row was set later (an admin's
    edit); facts of upstreams deleted meanwhile are dropped."""
    from tenants.models import Upstream, UpstreamLearnedLimit

    newest: dict[tuple[int, str, str], dict[str, Any]] = {}
    for r in records:
        key = (int(r["upstream_id"]), db_text(r["model"])[:200], db_text(r["parameter"])[:100])
        if key not in newest or newest[key]["learned_at"] <= r["learned_at"]:
            newest[key] = r
    if not newest:
        return
    alive = set(Upstream.objects.filter(pk__in={k[0] for k in newest}).values_list("pk", flat=True))
    rows = {(r.upstream_id, r.model, r.parameter): r for r in UpstreamLearnedLimit.objects.filter(
        upstream_id__in=alive, model__in={k[1] for k in newest})}
    for key, r in newest.items():
        held = rows.get(key)
        if key[0] not in alive or (held is not None and held.learned_at >= _when(r["learned_at"])):
            continue
        UpstreamLearnedLimit.objects.update_or_create(
            upstream_id=key[0], model=key[1], parameter=key[2],
            defaults={"value": r.get("limit"), "learned_at": _when(r["learned_at"]),
                      "expires_at": _when(r["expires_at"]), "detail": db_text(r.get("detail", ""))})


def requests_interrupt(*, ids: Iterable[str]) -> int:
    """Mark requests that started and never finished (their process died) ``interrupted``; returns how many."""
    rows = ProxyRequest.objects.filter(id__in=[uuid.UUID(i) for i in ids], outcome=ProxyRequest.Outcome.PENDING)
    return rows.update(outcome=ProxyRequest.Outcome.INTERRUPTED, finished=timezone.now(),
                       error="the proxy process serving this request stopped before it ended")
