"""The alert rules of a webhook, evaluated over the audit rows of its tenant (``AlertWebhook`` says which are on).

``firing(webhook, now)`` returns the alerts due now, each ``(rule, subject, alert)`` with ``alert`` in
the generic shape of ``infra.webhook``. Cheap: one grouped query per rule over the indexed
``(tenant, created)`` columns of the window.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q

from alerts.models import AlertDelivery, AlertWebhook
from audit.models import Finding, ProxyRequest
from tenants.models import Upstream

#: Request outcomes that mean "needed a retry" (request-level corruption, as the dashboard and Prometheus).
CORRUPTED = (ProxyRequest.Outcome.RECOVERED, ProxyRequest.Outcome.EXHAUSTED)
AGENT_LOOP = "agent-loop"
#: The finding a money budget leaves once per window when it passes its soft threshold (``proxy.policy.limits``).
BUDGET_THRESHOLD = "money-budget-threshold"

Firing = tuple[str, str, dict[str, Any]]


def alert(webhook: AlertWebhook, rule: str, subject: str, summary: str, *, value: float | None,
          threshold: float | None, now: datetime) -> dict[str, Any]:
    """An alert of ``webhook``'s tenant (the generic body of ``infra.webhook``)."""
    return {"event": "alert", "rule": rule, "tenant": webhook.tenant.slug, "subject": subject, "summary": summary,
            "value": value, "threshold": threshold, "window_minutes": webhook.window_minutes, "at": now.isoformat()}


def _corruption(webhook: AlertWebhook, since: datetime, now: datetime) -> list[Firing]:
    threshold = webhook.corruption_rate
    if threshold is None:
        return []
    rows = (ProxyRequest.objects.filter(tenant_id=webhook.tenant_id, created__gte=since, created__lt=now,
                                        path=ProxyRequest.Path.GUARDED, upstream__isnull=False)
            .values("upstream_id").annotate(total=Count("id"), bad=Count("id", filter=Q(outcome__in=CORRUPTED))))
    due = [(r["upstream_id"], r["bad"] / r["total"]) for r in rows
           if r["total"] >= max(1, webhook.min_requests) and r["bad"] / r["total"] >= threshold]
    names = dict(Upstream.objects.filter(pk__in=[pk for pk, _ in due]).values_list("pk", "name"))
    out = []
    for upstream_id, rate in due:
        name = names.get(upstream_id, f"upstream {upstream_id}")
        summary = (f"{rate:.0%} of guarded requests to upstream {name} needed a retry in the last "
                   f"{webhook.window_minutes} min (threshold {threshold:.0%})")
        out.append((AlertDelivery.Rule.CORRUPTION.value, f"upstream {name}",
                    alert(webhook, "corruption-rate", f"upstream {name}", summary, value=round(rate, 4),
                          threshold=threshold, now=now)))
    return out


def _budgets(webhook: AlertWebhook, since: datetime, now: datetime) -> list[Firing]:
    """One alert per money budget of the tenant that passed its soft threshold in the window (always on:
    the threshold is the budget's own, else its holder's ``money_soft_percent``, else ``MONEY_SOFT_PERCENT``).
    The subject names the budget as the tenant's admin knows it: "the tenant's daily budget", "member alice's weekly
    budget", "key tr-abc123's monthly budget" (the finding's detail speaks to the client)."""
    out = []
    seen: set[str] = set()
    rows = (Finding.objects.filter(tenant_id_copy=webhook.tenant_id, created__gte=since, created__lt=now,
                                   kind=BUDGET_THRESHOLD).order_by("created")
            .values_list("detail", "request__member_username", "request__api_key__prefix"))
    for detail, member, prefix in rows:
        subject = _budget_subject(detail.split(" passed ")[0], member or "", prefix or "")
        if subject in seen:
            continue
        seen.add(subject)
        out.append((AlertDelivery.Rule.BUDGET.value, subject,
                    alert(webhook, AlertDelivery.Rule.BUDGET.value, subject, detail, value=None, threshold=None,
                          now=now)))
    return out


def _budget_subject(budget: str, member: str, prefix: str) -> str:
    """``budget`` ("your personal daily budget", "this key's weekly budget", "the tenant's ...") named for the
    tenant's admin, at most 100 characters."""
    if budget.startswith("your personal ") and member:
        budget = f"member {member}'s {budget.removeprefix('your personal ')}"
    elif budget.startswith("this key's ") and prefix:
        period = budget.removeprefix("this key's ")
        budget = f"key tr-{prefix}'s {period}"
    return budget[:100] or "money budget"


def _counted(webhook: AlertWebhook, rule: str, over: int | None, count: int, what: str, now: datetime) -> list[Firing]:
    if over is None or count <= over:
        return []
    summary = f"{count} {what} in the last {webhook.window_minutes} min (more than {over})"
    return [(rule, "tenant", alert(webhook, rule, "tenant", summary, value=count, threshold=over, now=now))]


def firing(webhook: AlertWebhook, now: datetime) -> list[Firing]:
    """The rules of ``webhook`` over its window ending at ``now`` that are over their thresholds."""
    since = now - timedelta(minutes=webhook.window_minutes)
    out = _corruption(webhook, since, now)
    if webhook.exhausted_over is not None:
        exhausted = ProxyRequest.objects.filter(tenant_id=webhook.tenant_id, created__gte=since, created__lt=now,
                                                outcome=ProxyRequest.Outcome.EXHAUSTED).count()
        out += _counted(webhook, AlertDelivery.Rule.EXHAUSTED.value, webhook.exhausted_over, exhausted,
                        "requests ran out of retries", now)
    if webhook.loops_over is not None:
        loops = Finding.objects.filter(tenant_id_copy=webhook.tenant_id, created__gte=since, created__lt=now,
                                       kind=AGENT_LOOP).count()
        out += _counted(webhook, AlertDelivery.Rule.LOOPS.value, webhook.loops_over, loops, "agent loops broken", now)
    return out + _budgets(webhook, since, now)
