"""Spend of a tenant (optionally one member) over a period, from the audit rows (pure ORM, read-only).

``spend(tenant, ...)`` is the figure ``manage.py usage --json`` prints (docs/money.md): requests, cost split
into delivered and wasted USD, requests with no price (``unpriced_requests``: their cost is not in the
sums, never counted as $0) and with estimated usage, per model and per member. Requests refused before
any upstream call (a limit's 429) cost nothing and are not counted.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from audit.models import ProxyRequest
from tenants.models import Tenant

_ZERO = Decimal(0)


def _usd(value: Decimal | None) -> float:
    return round(float(value or _ZERO), 10)


def requests_of(tenant: Tenant, *, member: str | None = None, since: datetime | None = None,
                until: datetime | None = None) -> QuerySet[ProxyRequest]:
    """The tenant's requests that reached an upstream, in ``[since, until)`` by start, of ``member``'s keys
    (a user name, as recorded on the request: ``ProxyRequest.member_username``) when given."""
    rows = ProxyRequest.objects.filter(tenant=tenant).exclude(outcome=ProxyRequest.Outcome.REJECTED, attempts=0)
    if since is not None:
        rows = rows.filter(created__gte=since)
    if until is not None:
        rows = rows.filter(created__lt=until)
    if member is not None:
        rows = rows.filter(member_username=member)
    return rows


def _sums() -> dict[str, Any]:
    return {"requests": Count("pk"), "cost": Coalesce(Sum("cost_usd"), _ZERO),
            "wasted": Coalesce(Sum("wasted_usd"), _ZERO)}


def spend(tenant: Tenant, *, member: str | None = None, since: datetime | None = None,
          until: datetime | None = None) -> dict[str, Any]:
    """``{"tenant", "requests", "cost_usd", "delivered_usd", "wasted_usd", "unpriced_requests",
    "estimated_requests", "by_model": [{"model", "requests", "cost_usd", "wasted_usd"}], "by_member":
    [{"member", "requests", "cost_usd", "wasted_usd"}]}``; USD as floats, most expensive first."""
    rows = requests_of(tenant, member=member, since=since, until=until)
    totals = rows.aggregate(**_sums(), delivered=Coalesce(Sum("delivered_usd"), _ZERO),
                            unpriced=Count("pk", filter=Q(unpriced=True)),
                            estimated=Count("pk", filter=Q(usage_estimated=True)))
    by_model = [{"model": r["model"], "requests": r["requests"], "cost_usd": _usd(r["cost"]),
                 "wasted_usd": _usd(r["wasted"])}
                for r in rows.values("model").annotate(**_sums()).order_by("-cost", "model")]
    by_member = [{"member": r["member_username"], "requests": r["requests"], "cost_usd": _usd(r["cost"]),
                  "wasted_usd": _usd(r["wasted"])}
                 for r in rows.exclude(member_username="").values("member_username").annotate(**_sums())
                 .order_by("-cost", "member_username")]
    return {"tenant": tenant.name, "requests": totals["requests"], "cost_usd": _usd(totals["cost"]),
            "delivered_usd": _usd(totals["delivered"]), "wasted_usd": _usd(totals["wasted"]),
            "unpriced_requests": totals["unpriced"], "estimated_requests": totals["estimated"],
            "by_model": by_model, "by_member": by_member}
