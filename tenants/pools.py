"""What operators see of credential pools and circuits (``manage.py upstreams status``, the admin): the
shared state (``infra.routing_health``) read for a tenant's upstreams, in the shape of issue 21 item 6."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q

from infra import routing_health as health
from infra import routing_quality as quality
from tenants.models import ModelRoute, Tenant, Upstream
from tenants.selectors import pool_keys, upstreams_for_tenant


def _iso(at: float) -> str | None:
    return datetime.fromtimestamp(at, tz=UTC).isoformat() if at else None


def upstreams_status(upstreams: list[Upstream], *, now: float | None = None) -> list[dict[str, Any]]:
    """Per upstream ``{"name", "circuit": "closed"|"open"|"half-open", "circuit_until": ISO|null,
    "keys": [{"id", "hint", "weight", "state": "ok"|"cooling"|"disabled", "until": ISO|null}],
    "broken_rate": {MODEL: float}}`` (one shared-state read for all; ``until``: the end of a cool-down, or
    null otherwise; ``broken_rate``: the live share of guarded first attempts found broken, per upstream model
    it served (asked by a route or passed through), over ``ROUTING_QUALITY_WINDOW_SECONDS``, for the models
    with a turn in the window)."""
    now = time.time() if now is None else now
    rates = broken_rates(upstreams, now)
    pools = [(u, pool_keys(u)) for u in upstreams]
    names = [health.circuit_name(u.pk) for u in upstreams]
    names += [health.key_name(u.pk, k[0]) for u, keys in pools for k in keys]
    raw = iter(health.read_sync(names))
    circuits = [health.Circuit.loads(next(raw)) for _ in upstreams]
    out: list[dict[str, Any]] = []
    for (upstream, keys), circuit in zip(pools, circuits, strict=True):
        state = circuit.state(now)
        shown = []
        for key_id, hint, weight, enabled in keys:
            key = health.KeyState.loads(next(raw))
            key_state = key.state(now) if enabled else health.DISABLED
            shown.append(
                {
                    "id": key_id,
                    "hint": hint,
                    "weight": weight,
                    "state": key_state,
                    "until": _iso(key.until) if key_state == health.COOLING else None,
                }
            )
        out.append(
            {
                "name": upstream.name,
                "circuit": state,
                "circuit_until": _iso(circuit.opened_until) if state == health.OPEN else None,
                "keys": shown,
                "broken_rate": rates.get(upstream.pk, {}),
            }
        )
    return out


def route_models(upstreams: list[Upstream]) -> list[tuple[int, str]]:
    """``(upstream id, upstream model)`` of every route target on ``upstreams`` (a blank model on an exact
    route is its public name; on a glob it is the client's, not known here), at most 500."""
    ids = {u.pk for u in upstreams}
    found: dict[tuple[int, str], None] = {}
    routes = ModelRoute.objects.filter(Q(upstream_id__in=ids) | Q(fallbacks__upstream_id__in=ids)).distinct()
    for route in routes.prefetch_related("fallbacks")[:200]:
        default = route.upstream_model or ("" if route.is_glob else route.public_name)
        pairs = [(route.upstream_id, default), *((f.upstream_id, f.model or default) for f in route.fallbacks.all())]
        found.update(((u, m), None) for u, m in pairs if u in ids and m)
    return list(found)[:500]


def live_rates(upstreams: list[Upstream], now: float) -> list[dict[str, Any]]:
    """``[{"upstream_id", "tenant_id", "upstream", "model", "rate": float|None, "turns": int}]``: the live
    broken-turn rate of every route target on ``upstreams`` (``route_models``) and of every model they served
    lately (``infra.routing_quality.served_sync``: a glob route's client models, a model no route names);
    ``rate`` None: no turn in the window. Upstream and model names as configured or asked."""
    pairs = list(dict.fromkeys([*route_models(upstreams),
                                *((uid, m) for uid, models in quality.served_sync([u.pk for u in upstreams]).items()
                                  for m in models)]))[:1000]
    by_id = {u.pk: u for u in upstreams}
    return [{"upstream_id": uid, "tenant_id": by_id[uid].tenant_id, "upstream": by_id[uid].name, "model": model,
             "rate": None if (seen := rate.observed()) is None else round(seen, 4), "turns": int(rate.total)}
            for (uid, model), rate in zip(pairs, quality.read_sync(pairs, now), strict=True)]


def broken_rates(upstreams: list[Upstream], now: float) -> dict[int, dict[str, float]]:
    """Per upstream id, ``{upstream model: live broken-turn rate}`` of the models with a turn in the window."""
    out: dict[int, dict[str, float]] = {}
    for row in live_rates(upstreams, now):
        if row["rate"] is not None:
            out.setdefault(row["upstream_id"], {})[row["model"]] = row["rate"]
    return out


def tenant_status(tenant: Tenant) -> dict[str, Any]:
    """``{"upstreams": [...]}`` of every upstream of ``tenant`` (``upstreams_status``), by name."""
    return {"upstreams": upstreams_status(list(upstreams_for_tenant(tenant).order_by("name")))}
