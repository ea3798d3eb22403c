"""Usage per person (issue 19 item 5): what each member's keys spent and wasted, and their incidents.

``member_rows(scope)`` is the one per-member aggregation: the usage page (group ``member``), the reports'
``by_member`` figures, the account page and the management API read it. Each row is a plain dict; a
request of a tenant's own key (no member) falls in the row whose ``member_id`` is None. To add columns
(costs), extend ``MEMBER_TOTALS`` (aggregates over ``ProxyRequest``) and ``member_row`` (how a grouped
row becomes output), or post-process the rows by ``member_id``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, DecimalField, F, IntegerField, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce

from audit.display import wasted_usage_unknown
from audit.models import Attempt, Finding, ProxyRequest
from audit.reports import CORRUPTED, GUARDED, Scope, rate, seconds
from audit.usage import AGENT_LOOP, FAILED_ATTEMPTS, LIMIT_HIT, RETRY_BUDGET_SPENT

Outcome = ProxyRequest.Outcome


def _sum(field: str) -> Any:
    return Coalesce(Sum(field), Value(0), output_field=IntegerField())


_MONEY: DecimalField = DecimalField(max_digits=20, decimal_places=10)  # type: ignore[type-arg]

#: Aggregates of one member's requests (name -> Django aggregate over ``ProxyRequest``).
MEMBER_TOTALS: dict[str, Callable[[], Any]] = {
    "n_requests": lambda: Count("pk"),
    "n_prompt": lambda: _sum("prompt_tokens"),
    "n_completion": lambda: _sum("completion_tokens"),
    "n_wasted_completion": lambda: _sum("wasted_completion_tokens"),
    "n_wasted_ms": lambda: Coalesce(Sum("wasted_ms"), 0.0),
    "n_wasted_unknown": lambda: Count("pk", filter=wasted_usage_unknown()),
    "n_guarded": lambda: Count("pk", filter=GUARDED),
    "n_corrupted": lambda: Count("pk", filter=CORRUPTED),
    "n_exhausted": lambda: Count("pk", filter=Q(outcome=Outcome.EXHAUSTED)),
    "n_recovered": lambda: Count("pk", filter=Q(outcome=Outcome.RECOVERED)),
    "n_limits": lambda: Count("pk", filter=LIMIT_HIT),
    "n_cost": lambda: Coalesce(Sum("cost_usd"), Value(Decimal(0)), output_field=_MONEY),
    "n_wasted_usd": lambda: Coalesce(Sum("wasted_usd"), Value(Decimal(0)), output_field=_MONEY),
    "n_unpriced": lambda: Count("pk", filter=Q(unpriced=True)),
}
#: The output columns of ``member_rows`` in order (CSV, report HTML).
MEMBER_COLUMNS = ("member", "tenant", "requests", "prompt_tokens", "completion_tokens", "wasted_prompt_tokens",
                  "wasted_completion_tokens", "wasted_unknown_requests", "wasted_seconds", "corrupted",
                  "corruption_rate", "exhausted", "recovered", "loops_broken", "limits_hit", "retry_budget_spent",
                  "incidents", "cost_usd", "wasted_usd", "unpriced")


def member_row(r: dict[str, Any], wasted_prompt: int, loops: int) -> dict[str, Any]:
    """One grouped row (``MEMBER_TOTALS`` names) as output; ``incidents`` = exhausted + recovered by retry +
    loops broken (what the live incident feed shows per request); ``wasted_unknown_requests``: the requests whose
    wasted usage is unknown (``audit.display.wasted_usage_unknown``), so the wasted figures read as the request
    pages read them (``audit.display.wasted_figure``)."""
    return {
        "member_id": r["member_id"], "member": r["member__user__username"] or "(tenant keys)",
        "tenant": r["tenant__slug"], "requests": r["n_requests"], "prompt_tokens": int(r["n_prompt"]),
        "completion_tokens": int(r["n_completion"]), "wasted_prompt_tokens": wasted_prompt,
        "wasted_completion_tokens": int(r["n_wasted_completion"]),
        "wasted_unknown_requests": int(r.get("n_wasted_unknown") or 0), "wasted_seconds": seconds(r["n_wasted_ms"]),
        "cost_usd": round(float(r.get("n_cost") or 0), 10), "wasted_usd": round(float(r.get("n_wasted_usd") or 0), 10),
        "unpriced": r.get("n_unpriced") or 0,
        "corrupted": r["n_corrupted"], "corruption_rate": rate(r["n_corrupted"], r["n_guarded"]),
        "exhausted": r["n_exhausted"], "recovered": r["n_recovered"], "loops_broken": loops,
        "limits_hit": r["n_limits"], "incidents": r["n_exhausted"] + r["n_recovered"] + loops,
    }


def member_rows_of(requests: QuerySet[ProxyRequest], findings: QuerySet[Finding]) -> list[dict[str, Any]]:
    """Per member (and one row for tenant keys per tenant) over ``requests``; ``findings`` are those of
    the same requests. Most requests first. Three grouped queries."""
    grouped = (requests.order_by().values("member_id", "member__user__username", "tenant_id", "tenant__slug")
               .annotate(**{name: make() for name, make in MEMBER_TOTALS.items()}))
    wasted = {(r["m"], r["t"]): r["n"] for r in Attempt.objects.filter(request__in=requests.order_by(),
                                                                        outcome__in=FAILED_ATTEMPTS)
              .values(m=F("request__member_id"), t=F("request__tenant_id")).annotate(n=_sum("prompt_tokens"))}
    counted = {(r["m"], r["t"], r["kind"]): r["n"] for r in findings.filter(kind__in=(AGENT_LOOP, RETRY_BUDGET_SPENT))
               .order_by().values("kind", m=F("request__member_id"), t=F("request__tenant_id")).annotate(n=Count("pk"))}
    out = []
    for r in grouped:
        key = (r["member_id"], r["tenant_id"])
        row = member_row(r, int(wasted.get(key, 0)), counted.get((*key, AGENT_LOOP), 0))
        row["retry_budget_spent"] = counted.get((*key, RETRY_BUDGET_SPENT), 0)
        out.append(row)
    return sorted(out, key=lambda row: (-row["requests"], row["tenant"], row["member"]))


def member_rows(scope: Scope) -> list[dict[str, Any]]:
    """``member_rows_of`` over a report or dashboard ``Scope`` (tenants already narrowed to the viewer's)."""
    return member_rows_of(scope.requests(), scope.findings())


def usage_rows_by_member(scope: Scope) -> list[dict[str, Any]]:
    """``member_rows`` in the usage page's shape (``audit.usage.COLUMNS`` plus ``incidents``; ``group`` is
    ``tenant / member``, ``id`` the member id)."""
    return [{**row, "id": row["member_id"], "group": f"{row['tenant']} / {row['member']}"}
            for row in member_rows(scope)]


def member_totals(member_id: int, tenant_id: int, *, since: datetime, until: datetime) -> dict[str, Any]:
    """One member's row over ``[since, until)`` (zeros when they made no request): the account page and API."""
    requests = ProxyRequest.objects.filter(tenant_id=tenant_id, member_id=member_id, created__gte=since,
                                           created__lt=until)
    findings = Finding.objects.filter(tenant_id_copy=tenant_id, request__member_id=member_id,
                                      request__created__gte=since, request__created__lt=until)
    rows = member_rows_of(requests, findings)
    if rows:
        return rows[0]
    empty = {name: 0 for name in MEMBER_TOTALS} | {"n_wasted_ms": 0.0}
    row = member_row({**empty, "member_id": member_id, "member__user__username": "", "tenant_id": tenant_id,
                      "tenant__slug": ""}, 0, 0)
    return {**row, "retry_budget_spent": 0}


def key_tokens(member_id: int, tenant_id: int, *, since: datetime) -> dict[int, dict[str, int]]:
    """Per key of one member since ``since``: ``{key_id: {"requests", "tokens"}}`` (tokens in + out)."""
    rows = (ProxyRequest.objects.filter(tenant_id=tenant_id, member_id=member_id, created__gte=since)
            .order_by().values("api_key_id").annotate(n=Count("pk"), p=_sum("prompt_tokens"),
                                                      c=_sum("completion_tokens")))
    return {r["api_key_id"]: {"requests": r["n"], "tokens": int(r["p"]) + int(r["c"])} for r in rows
            if r["api_key_id"] is not None}
