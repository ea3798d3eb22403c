"""Analysis figures: a ``Scope`` (period, tenants, upstreams) -> one JSON-ready dict.

Read-only and free of side effects apart from the optional ``progress`` callback, so the dashboard,
the Celery report task and the tests share it. Every figure is an aggregate query; nothing here
loads rows one by one. The dict's shape is the report's JSON summary, ``schema_version``
``SCHEMA_VERSION``, documented field by field in ``docs/reports.md`` and pinned by
``audit.schema.SUMMARY_SCHEMA``.

Definitions (also in docs/reports.md):

- *guarded*: a request on the guarded path (streamed with ``tools``);
- *corrupted*: a guarded request with at least one unusable attempt, i.e. it ended
  ``recovered-by-retry`` or ``exhausted``; *corruption rate* (request level) = corrupted / guarded;
- *faulty attempt*: an attempt of a guarded request with at least one finding (the upstream's answer
  deviated in any way, even when the guard absorbed it); *attempt fault rate* (attempt level) =
  faulty attempts / attempts of guarded requests. A simulator that corrupts one attempt in five
  shows about 20 % here, and a lower request-level rate: most faults are repaired in place;
- a *kind's share*: requests (any path) with at least one finding of that kind / requests;
- *wasted*: completion tokens and time of the attempts that were not the answer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, DecimalField, FloatField, IntegerField, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, Trunc
from django.utils import timezone

from audit.display import wasted_usage_unknown
from audit.models import Finding, ProxyRequest
from proxy.guard.findings import Action
from tenants.models import Tenant, Upstream

SCHEMA_VERSION = 1
#: Rows kept in the "most affected" tables and lines drawn per over-time chart.
TOP = 10
SERIES_TOP = 5
#: Periods up to ``MINUTELY_UP_TO`` are bucketed by minute, up to ``HOURLY_UP_TO`` by hour, longer by day.
MINUTELY_UP_TO = timedelta(hours=2)
HOURLY_UP_TO = timedelta(days=2)
BUCKET_STEPS = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}

Outcome = ProxyRequest.Outcome
CORRUPTED_OUTCOMES = (Outcome.RECOVERED, Outcome.EXHAUSTED)
#: Outcomes where the client got a usable answer (used by recovery by attempt number).
USABLE_OUTCOMES = (Outcome.CLEAN, Outcome.NORMALIZED, Outcome.REPAIRED, Outcome.RECOVERED)
#: Outcomes where the guard changed something or had to retry.
TOUCHED_OUTCOMES = (Outcome.NORMALIZED, Outcome.REPAIRED, Outcome.RECOVERED, Outcome.EXHAUSTED)
FATAL_ACTIONS = (Action.RETRY.value, Action.ERROR.value)

GUARDED = Q(path=ProxyRequest.Path.GUARDED)
CORRUPTED = GUARDED & Q(outcome__in=CORRUPTED_OUTCOMES)

Progress = Callable[[int], None]
Figures = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Scope:
    """What a report or the dashboard covers: ``[since, until)``, tenants and upstreams (None = all)."""

    since: datetime
    until: datetime
    tenant_ids: tuple[int, ...] | None = None
    upstream_ids: tuple[int, ...] | None = None

    @property
    def bucket(self) -> str:
        """``minute`` up to two hours, ``hour`` up to two days, else ``day``."""
        span = self.until - self.since
        return "minute" if span <= MINUTELY_UP_TO else "hour" if span <= HOURLY_UP_TO else "day"

    def requests(self) -> QuerySet[ProxyRequest]:
        """The scope's requests (unordered)."""
        rows = ProxyRequest.objects.filter(created__gte=self.since, created__lt=self.until)
        if self.tenant_ids is not None:
            rows = rows.filter(tenant_id__in=self.tenant_ids)
        if self.upstream_ids is not None:
            rows = rows.filter(upstream_id__in=self.upstream_ids)
        return rows.order_by()

    def findings(self) -> QuerySet[Finding]:
        """Findings of the scope's requests (period by the request's start, like every figure)."""
        rows = Finding.objects.filter(request__created__gte=self.since, request__created__lt=self.until)
        if self.tenant_ids is not None:
            rows = rows.filter(tenant_id_copy__in=self.tenant_ids)
        if self.upstream_ids is not None:
            rows = rows.filter(request__upstream_id__in=self.upstream_ids)
        return rows.order_by()


def rate(part: int, whole: int) -> float:
    """``part / whole`` rounded to 4 places; 0.0 when ``whole`` is 0."""
    return round(part / whole, 4) if whole else 0.0


def seconds(ms: float | None) -> float:
    """Milliseconds as seconds rounded to 3 places."""
    return round((ms or 0.0) / 1000, 3)


_MONEY: DecimalField = DecimalField(max_digits=20, decimal_places=10)  # type: ignore[type-arg]


def _request_counts() -> dict[str, Any]:
    """The aggregates every per-dimension row of requests carries."""
    return {
        "n_requests": Count("pk"),
        "n_guarded": Count("pk", filter=GUARDED),
        "n_corrupted": Count("pk", filter=CORRUPTED),
        "n_exhausted": Count("pk", filter=Q(outcome=Outcome.EXHAUSTED)),
        "wasted_tokens": Coalesce(Sum("wasted_completion_tokens"), Value(0), output_field=IntegerField()),
        "wasted_ms_sum": Coalesce(Sum("wasted_ms"), Value(0.0), output_field=FloatField()),
        "cost_sum": Coalesce(Sum("cost_usd"), Value(Decimal(0)), output_field=_MONEY),
        "wasted_usd_sum": Coalesce(Sum("wasted_usd"), Value(Decimal(0)), output_field=_MONEY),
        "n_unpriced": Count("pk", filter=Q(unpriced=True)),
        "n_wasted_unknown": Count("pk", filter=wasted_usage_unknown()),
    }


def usd(value: Any) -> float:
    """A sum of USD (``Decimal``) as a float rounded to 10 places (a micro-dollar keeps 4 significant digits)."""
    return round(float(value or 0), 10)


def _request_row(row: dict[str, Any]) -> dict[str, Any]:
    """The common columns of a per-dimension row."""
    return {
        "requests": row["n_requests"],
        "guarded": row["n_guarded"],
        "corrupted": row["n_corrupted"],
        "corruption_rate": rate(row["n_corrupted"], row["n_guarded"]),
        "exhausted": row["n_exhausted"],
        "wasted_completion_tokens": int(row["wasted_tokens"]),
        "wasted_unknown_requests": row["n_wasted_unknown"],
        "wasted_seconds": seconds(row["wasted_ms_sum"]),
        "cost_usd": usd(row["cost_sum"]),
        "wasted_usd": usd(row["wasted_usd_sum"]),
        "unpriced": row["n_unpriced"],
    }


def _by_corruption(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Most corrupted first, then most requests, then by name: a stable order."""
    return sorted(rows, key=lambda r: (-r["corrupted"], -r["requests"], str(r[key])))


# ----- the figures, one function each -----

def totals(scope: Scope) -> dict[str, Any]:
    """Counts, shares and waste over the whole scope."""
    agg = scope.requests().aggregate(
        **_request_counts(),
        n_touched=Count("pk", filter=Q(outcome__in=TOUCHED_OUTCOMES)),
        n_recovered=Count("pk", filter=Q(outcome=Outcome.RECOVERED)),
        n_attempts=Coalesce(Sum("attempts"), Value(0), output_field=IntegerField()),
        n_prompt=Coalesce(Sum("prompt_tokens"), Value(0), output_field=IntegerField()),
        n_completion=Coalesce(Sum("completion_tokens"), Value(0), output_field=IntegerField()),
    )
    return {
        "requests": agg["n_requests"],
        "guarded": agg["n_guarded"],
        "guarded_share": rate(agg["n_guarded"], agg["n_requests"]),
        "touched": agg["n_touched"],
        "corrupted": agg["n_corrupted"],
        "corruption_rate": rate(agg["n_corrupted"], agg["n_guarded"]),
        "recovered": agg["n_recovered"],
        "exhausted": agg["n_exhausted"],
        "attempts": int(agg["n_attempts"]),
        "prompt_tokens": int(agg["n_prompt"]),
        "completion_tokens": int(agg["n_completion"]),
        "wasted_completion_tokens": int(agg["wasted_tokens"]),
        "wasted_unknown_requests": agg["n_wasted_unknown"],
        "wasted_seconds": seconds(agg["wasted_ms_sum"]),
        "cost_usd": usd(agg["cost_sum"]),
        "wasted_usd": usd(agg["wasted_usd_sum"]),
        "unpriced": agg["n_unpriced"],
        "findings": scope.findings().count(),
        **attempt_totals(scope),
    }


def attempt_totals(scope: Scope) -> dict[str, Any]:
    """Attempt-level figures of guarded requests: attempts, faulty ones (any finding), failed ones
    (a fatal finding), and the attempt fault rate (the figure a fault injector's rate compares to)."""
    guarded = scope.requests().filter(GUARDED).aggregate(
        n=Coalesce(Sum("attempts"), Value(0), output_field=IntegerField()))["n"]
    tied = scope.findings().filter(request__path=ProxyRequest.Path.GUARDED, attempt__isnull=False)
    faulty = tied.values("attempt_id").distinct().count()
    failed = tied.filter(action__in=FATAL_ACTIONS).values("attempt_id").distinct().count()
    return {"guarded_attempts": int(guarded), "faulty_attempts": faulty, "attempt_fault_rate": rate(faulty, guarded),
            "failed_attempts": failed}


def outcomes(scope: Scope) -> dict[str, int]:
    """Requests per outcome, every outcome present (zero-filled)."""
    counts = dict(scope.requests().values_list("outcome").annotate(n=Count("pk")).values_list("outcome", "n"))
    return {value: counts.get(value, 0) for value in Outcome.values}


def by_upstream(scope: Scope) -> list[dict[str, Any]]:
    """Per upstream the request was routed to (``null`` for requests refused before routing)."""
    rows = (scope.requests().values("upstream_id", "upstream__name", "upstream__tenant__slug")
            .annotate(**_request_counts()))
    return _by_corruption([
        {"upstream_id": r["upstream_id"], "upstream": r["upstream__name"] or "(none)",
         "tenant": r["upstream__tenant__slug"], **_request_row(r)}
        for r in rows
    ], "upstream")


def by_model(scope: Scope) -> list[dict[str, Any]]:
    """Per model name the client asked for."""
    rows = scope.requests().values("model").annotate(**_request_counts())
    return _by_corruption([{"model": r["model"], **_request_row(r)} for r in rows], "model")


def by_kind(scope: Scope, requests_total: int) -> list[dict[str, Any]]:
    """Per finding kind: findings, requests showing it, fatal findings, its share of requests, and
    ``wasted_usd``: the cost of the failed attempts (retried or failed upstream calls) that showed it (an
    attempt with two kinds counts for each)."""
    rows = scope.findings().values("kind").annotate(
        n=Count("pk"), n_requests=Count("request_id", distinct=True),
        n_fatal=Count("pk", filter=Q(action__in=FATAL_ACTIONS)))
    wasted: dict[str, float] = defaultdict(float)
    for kind, _, cost in (scope.findings().filter(attempt__outcome__in=("retry", "upstream-error"),
                                                  attempt__cost_usd__gt=0)
                          .values_list("kind", "attempt_id", "attempt__cost_usd").distinct()):
        wasted[kind] += float(cost or 0)
    out = [{"kind": r["kind"], "findings": r["n"], "requests": r["n_requests"], "fatal": r["n_fatal"],
            "share": rate(r["n_requests"], requests_total), "wasted_usd": usd(wasted.get(r["kind"], 0.0))}
           for r in rows]
    return sorted(out, key=lambda r: (-r["requests"], -r["findings"], r["kind"]))


def buckets(scope: Scope) -> list[datetime]:
    """Every bucket start of the period (UTC hours or days), for zero-filled series."""
    step = BUCKET_STEPS[scope.bucket]
    start = scope.since.astimezone(UTC).replace(second=0, microsecond=0)
    if scope.bucket != "minute":
        start = start.replace(minute=0)
    if scope.bucket == "day":
        start = start.replace(hour=0)
    out = []
    while start < scope.until:
        out.append(start)
        start += step
    return out


def _bucket_of(scope: Scope, field: str) -> Trunc:
    return Trunc(field, scope.bucket, tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def over_time(scope: Scope) -> list[dict[str, Any]]:
    """Requests, guarded, corrupted and the corruption rate per bucket, every bucket present."""
    rows = {r["bucket"]: r for r in scope.requests().annotate(bucket=_bucket_of(scope, "created"))
            .values("bucket").annotate(**_request_counts())}
    out = []
    for start in buckets(scope):
        r = rows.get(start, {"n_requests": 0, "n_guarded": 0, "n_corrupted": 0})
        out.append({"bucket": _iso(start), "requests": r["n_requests"], "guarded": r["n_guarded"],
                    "corrupted": r["n_corrupted"], "corruption_rate": rate(r["n_corrupted"], r["n_guarded"])})
    return out


def _series_over_time(scope: Scope, dimension: str, label: str, keep: Iterable[Any]) -> list[dict[str, Any]]:
    """Guarded / corrupted per bucket for the values ``keep`` of ``dimension`` (non-empty rows only)."""
    rows = (scope.requests().filter(GUARDED).filter(**{f"{dimension}__in": list(keep)})
            .annotate(bucket=_bucket_of(scope, "created")).values("bucket", dimension)
            .annotate(n_guarded=Count("pk"), n_corrupted=Count("pk", filter=CORRUPTED)))
    out = [{"bucket": _iso(r["bucket"]), label: r[dimension], "guarded": r["n_guarded"],
            "corrupted": r["n_corrupted"], "corruption_rate": rate(r["n_corrupted"], r["n_guarded"])}
           for r in rows]
    return sorted(out, key=lambda r: (r["bucket"], str(r[label])))


def over_time_by_upstream(scope: Scope, upstreams: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Corruption per bucket for the ``SERIES_TOP`` most corrupted upstreams (labelled by name)."""
    top = [u["upstream_id"] for u in upstreams if u["upstream_id"] is not None and u["guarded"]][:SERIES_TOP]
    names = {u["upstream_id"]: u["upstream"] for u in upstreams}
    rows = _series_over_time(scope, "upstream_id", "upstream_id", top)
    for row in rows:
        row["upstream"] = names[row["upstream_id"]]
    return sorted(rows, key=lambda r: (r["bucket"], r["upstream"], r["upstream_id"]))


def over_time_by_model(scope: Scope, models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Corruption per bucket for the ``SERIES_TOP`` most corrupted models."""
    return _series_over_time(scope, "model", "model", [m["model"] for m in models if m["guarded"]][:SERIES_TOP])


def over_time_by_kind(scope: Scope, kinds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests showing each of the ``SERIES_TOP`` most frequent kinds, per bucket."""
    keep = [k["kind"] for k in kinds[:SERIES_TOP]]
    rows = (scope.findings().filter(kind__in=keep).annotate(bucket=_bucket_of(scope, "request__created"))
            .values("bucket", "kind").annotate(n_requests=Count("request_id", distinct=True)))
    out = [{"bucket": _iso(r["bucket"]), "kind": r["kind"], "requests": r["n_requests"]} for r in rows]
    return sorted(out, key=lambda r: (r["bucket"], r["kind"]))


def recovery_by_attempt(scope: Scope) -> list[dict[str, Any]]:
    """Guarded requests that got a usable answer, by the (1-based) attempt that gave it."""
    rows = dict(scope.requests().filter(GUARDED, outcome__in=USABLE_OUTCOMES, attempts__gt=0)
                .values_list("attempts").annotate(n=Count("pk")).values_list("attempts", "n"))
    total = sum(rows.values())
    return [{"attempt": k, "requests": rows[k], "share": rate(rows[k], total)} for k in sorted(rows)]


def tools(scope: Scope) -> list[dict[str, Any]]:
    """The ``TOP`` tools with the most affected requests (findings that name a tool)."""
    rows = (scope.findings().exclude(tool_name="").values("tool_name")
            .annotate(n=Count("pk"), n_requests=Count("request_id", distinct=True),
                      n_fatal=Count("pk", filter=Q(action__in=FATAL_ACTIONS))))
    out = [{"tool": r["tool_name"], "findings": r["n"], "requests": r["n_requests"], "fatal": r["n_fatal"]}
           for r in rows]
    return sorted(out, key=lambda r: (-r["requests"], -r["findings"], r["tool"]))[:TOP]


def clients(scope: Scope) -> list[dict[str, Any]]:
    """The ``TOP`` clients (user agents) with the most corrupted requests."""
    rows = scope.requests().values("client_user_agent").annotate(**_request_counts())
    out = [{"user_agent": r["client_user_agent"], **_request_row(r)} for r in rows]
    return _by_corruption(out, "user_agent")[:TOP]


def describe_scope(scope: Scope) -> dict[str, Any]:
    """Tenant slugs and upstream names of the scope (``null`` = all)."""
    tenants = None if scope.tenant_ids is None else sorted(
        Tenant.objects.filter(pk__in=scope.tenant_ids).values_list("slug", flat=True))
    upstreams = None if scope.upstream_ids is None else sorted(
        f"{tenant}/{name}" for tenant, name in
        Upstream.objects.filter(pk__in=scope.upstream_ids).values_list("tenant__slug", "name"))
    return {"tenants": tenants, "upstreams": upstreams}


def build_figures(scope: Scope, *, progress: Progress | None = None, now: datetime | None = None) -> Figures:
    """Every figure of ``scope``; ``progress(percent)`` is called as sections complete (0..100)."""
    report = _Progress(progress, steps=12)
    figures: Figures = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": _iso(now or timezone.now()),
        "period": {"since": _iso(scope.since), "until": _iso(scope.until), "bucket": scope.bucket},
        "scope": describe_scope(scope),
    }
    figures["totals"] = report.step(totals(scope))
    figures["outcomes"] = report.step(outcomes(scope))
    figures["by_upstream"] = report.step(by_upstream(scope))
    figures["by_model"] = report.step(by_model(scope))
    figures["by_kind"] = report.step(by_kind(scope, figures["totals"]["requests"]))
    figures["over_time"] = report.step(over_time(scope))
    figures["over_time_by_upstream"] = report.step(over_time_by_upstream(scope, figures["by_upstream"]))
    figures["over_time_by_model"] = report.step(over_time_by_model(scope, figures["by_model"]))
    figures["over_time_by_kind"] = report.step(over_time_by_kind(scope, figures["by_kind"]))
    figures["recovery_by_attempt"] = report.step(recovery_by_attempt(scope))
    figures["tools"] = report.step(tools(scope))
    figures["clients"] = report.step(clients(scope))
    return figures


class _Progress:
    """Turns completed steps into percentages for an optional callback."""

    def __init__(self, callback: Progress | None, *, steps: int) -> None:
        self.callback = callback
        self.steps = steps
        self.done = 0

    def step(self, value: Any) -> Any:
        self.done += 1
        if self.callback is not None:
            self.callback(self.done * 100 // self.steps)
        return value


def series(rows: list[dict[str, Any]], label: str, value: str) -> dict[str, dict[str, float]]:
    """Over-time rows -> {label: {bucket: value}} for charts."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for row in rows:
        out[str(row[label])][row["bucket"]] = row[value]
    return dict(out)

