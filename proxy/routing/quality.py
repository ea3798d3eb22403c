"""The live broken-turn rates on the request path (``infra.routing_quality`` has the rule and the names).

``rates(store, targets)`` reads the rates of a route's targets for a new session's choice: one ``admit`` of
zero-cost windows (a read in one round trip, concurrent with the router's ``recall_many``), skipped when
this process read them less than ``ROUTING_QUALITY_CACHE_SECONDS`` ago (rates move over minutes; the copy
keeps the choice off Redis for steady traffic). ``count(store, target, broken=...)`` counts a guarded
request's first attempt and returns the target's rate after it (one ``admit``, run detached by the relay);
it also notes the model in its upstream's served list (``infra.routing_quality.served_key``: one ``append``,
at most once per target per quarter window in this process), so ``upstreams status`` shows a rate for every
model the upstream served, not only for those the routes name.
Both fail open: the shared state never raises, and unknown counts read as no turn.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence

from django.conf import settings

from infra.routing_quality import SERVED_MAX, Rate, rate_of, served_key, target_key, windows
from infra.shared_state import SharedState
from tenants.principal import UpstreamTarget

#: Per shared state: target key -> (monotonic time read, rate). Bounded: cleared past ``_CACHE_MAX``.
_caches: weakref.WeakKeyDictionary[SharedState, dict[str, tuple[float, Rate]]] = weakref.WeakKeyDictionary()
_CACHE_MAX = 10_000


def cached(store: SharedState, targets: Sequence[UpstreamTarget]) -> list[Rate] | None:
    """The rates of ``targets`` from this process's copy when every one is fresh, else None."""
    cache = _caches.get(store)
    if cache is None:
        return None
    now = time.monotonic()
    ttl = float(settings.ROUTING_QUALITY_CACHE_SECONDS)
    found = []
    for t in targets:
        hit = cache.get(target_key(t.upstream_id, t.model))
        if hit is None or now - hit[0] >= ttl:
            return None
        found.append(hit[1])
    return found


async def rates(store: SharedState, targets: Sequence[UpstreamTarget]) -> list[Rate]:
    """The live rates of ``targets`` (in their order), from this process's copy when fresh."""
    cache = _caches.setdefault(store, {})
    now = time.monotonic()
    ttl = float(settings.ROUTING_QUALITY_CACHE_SECONDS)
    keys = [target_key(t.upstream_id, t.model) for t in targets]
    missing = [(k, t) for k, t in zip(keys, targets, strict=True)
               if (hit := cache.get(k)) is None or now - hit[0] >= ttl]
    if missing:
        read = [w for _, t in missing for w in windows(t.upstream_id, t.model)]
        verdict = await store.admit(read)
        if len(cache) + len(missing) > _CACHE_MAX:
            cache.clear()
        for i, (key, _) in enumerate(missing):
            counts = verdict.usage[2 * i : 2 * i + 2] if len(verdict.usage) >= 2 * i + 2 else ()
            cache[key] = (now, rate_of(counts[0].used, counts[1].used) if counts else Rate())
    return [hit[1] if (hit := cache.get(k)) is not None else Rate() for k in keys]


async def count(store: SharedState, target: UpstreamTarget, *, broken: bool) -> Rate:
    """Count one judged first attempt on ``target`` (``broken``: found broken); the rate after it (also
    kept as this process's copy)."""
    verdict = await store.admit(list(windows(target.upstream_id, target.model, total=1, broken=int(broken))))
    rate = rate_of(verdict.usage[0].used, verdict.usage[1].used) if len(verdict.usage) == 2 else Rate()
    await _note_served(store, target)
    if rate.total:
        cache = _caches.setdefault(store, {})
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[target_key(target.upstream_id, target.model)] = (time.monotonic(), rate)
    return rate


#: Per shared state: (upstream id, model) -> monotonic time this process last noted it served. Bounded.
_noted: weakref.WeakKeyDictionary[SharedState, dict[tuple[int, str], float]] = weakref.WeakKeyDictionary()


async def _note_served(store: SharedState, target: UpstreamTarget) -> None:
    """Add ``target``'s model to its upstream's served list, unless this process did less than a quarter of
    ``ROUTING_QUALITY_WINDOW_SECONDS`` ago (the list lives a window after its last addition)."""
    window = max(10.0, float(settings.ROUTING_QUALITY_WINDOW_SECONDS))
    noted = _noted.setdefault(store, {})
    pair, now = (target.upstream_id, target.model[:200]), time.monotonic()
    if not pair[1] or now - noted.get(pair, -window) < window / 4:
        return
    if len(noted) >= _CACHE_MAX:
        noted.clear()
    noted[pair] = now
    await store.append(served_key(target.upstream_id), pair[1], ttl=window, max_len=SERVED_MAX)
