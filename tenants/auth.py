"""The auth door of the proxy path: an API key -> a ``Principal``, in one call (STYLE.md rule 6).

``authorize(raw)`` looks the key up (by prefix, compared in constant time), checks it and its
tenant, and caches the answer for ``AUTH_CACHE_SECONDS``; refused keys are cached too. A cached key
costs no database round trip and no thread hop: the lookup runs on the event loop, and once an
entry has lived half its lifetime the next caller schedules a refresh in the background (refresh
ahead), so a key in steady use never waits for the database while no entry is served past its
expiry (the bound on how long a revoked key keeps working is unchanged).

A ``Principal`` is frozen and ORM-free: tenant, key, routes with their guard policies and upstream
targets (credentials still encrypted), so nothing on the event loop touches a model instance.

Serving without the database: lookups run in auth threads of their own with a client-side deadline;
when the database is down, slow or frozen a key is served from its last good answer
(``tenants.last_good``: shared through Redis or a local file, at most ``AUTH_STALE_SECONDS`` old);
a key with no such answer gets ``AuthUnavailable`` (the consumer answers 503 with ``Retry-After``),
never a 401 or a guess. A refused key is cached as refused and forgotten by the last-good store, so
the stale window never extends a revoked key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connections
from django.db.utils import Error as DatabaseError

from infra.background import schedule
from infra.dbcall import bounded
from tenants import last_good, revocation
from tenants.key_cache import key_cache
from tenants.learned import LearnedFact
from tenants.limits import Limits
from tenants.models import API_KEY_PREFIX, ApiKey, ModelRoute, Upstream, UpstreamCredential, UpstreamLearnedLimit
from tenants.principal import Principal, Route, UpstreamTarget

logger = logging.getLogger(__name__)


class KeyRefused(Exception):
    """The key cannot be used: ``reason`` is ``invalid`` (unknown, malformed, wrong secret, revoked,
    expired) or ``disabled`` (its tenant is disabled)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _target(upstream: Upstream, learned: dict[int, tuple[LearnedFact, ...]],
            pools: dict[int, list[tuple[str, str, int]]] | None = None) -> UpstreamTarget:
    own = [("0", upstream.credential_encrypted, 1)] if upstream.credential_encrypted else []
    keys = tuple(own + (pools or {}).get(upstream.pk, []))
    return UpstreamTarget(
        upstream_id=upstream.pk, name=upstream.name, base_url=upstream.base_url.rstrip("/"), model="",
        extra_headers_encrypted=upstream.extra_headers_encrypted,
        connect_timeout=upstream.connect_timeout, first_byte_timeout=upstream.first_byte_timeout,
        idle_timeout=upstream.idle_timeout, request_deadline=upstream.request_deadline,
        learned=learned.get(upstream.pk, ()), keys=keys if len(keys) > 1 else (),
        credential_encrypted=keys[0][1] if keys else "", key_id=keys[0][0] if keys else "0",
        continuation=upstream.text_continuation,
    )


def _pools_of(tenant_id: int) -> dict[int, list[tuple[str, str, int]]]:
    """The enabled pool keys (``UpstreamCredential``) of the tenant's upstreams, by upstream id (one query)."""
    found: dict[int, list[tuple[str, str, int]]] = {}
    rows = UpstreamCredential.objects.filter(upstream__tenant_id=tenant_id, enabled=True).order_by("pk")
    for row in rows.values_list("upstream_id", "pk", "secret_encrypted", "weight"):
        found.setdefault(row[0], []).append((str(row[1]), row[2], max(1, int(row[3]))))
    return found


def _learned_of(tenant_id: int) -> dict[int, tuple[LearnedFact, ...]]:
    """The learned limits of the tenant's upstreams, by upstream id (one query)."""
    found: dict[int, list[LearnedFact]] = {}
    for row in UpstreamLearnedLimit.objects.filter(upstream__tenant_id=tenant_id).order_by("pk"):
        found.setdefault(row.upstream_id, []).append(row.fact())
    return {upstream_id: tuple(facts) for upstream_id, facts in found.items()}


def _principal(key: ApiKey) -> Principal:
    """Read everything a request needs of ``key``'s tenant (in a database thread)."""
    tenant = key.tenant
    learned = _learned_of(tenant.pk)
    pools = _pools_of(tenant.pk)
    routes = []
    for route in ModelRoute.objects.filter(tenant=tenant).select_related("upstream").prefetch_related(
            "fallbacks__upstream"):
        if route.upstream.tenant_id != tenant.pk:  # never another tenant's upstream (and credential)
            continue
        pairs = ((route.upstream, route.upstream_model),
                 *((fb.upstream, fb.model or route.upstream_model) for fb in route.fallbacks.all()
                   if fb.upstream.tenant_id == tenant.pk))
        targets = tuple((_target(up, learned, pools), model) for up, model in pairs if up.enabled)
        routes.append(Route(route.pk, route.public_name, route.is_glob, targets, route.max_output_tokens,
                            tenant.policy(route.policy_overrides()), route.request_deadline,
                            prefer=route.prefer, retry_target=route.retry_target,
                            continue_text=route.continue_text))
    default = tenant.default_upstream if tenant.default_upstream_id else None
    usable = default is not None and default.tenant_id == tenant.pk and default.enabled
    member = key.member if key.member_id else None
    if member is not None and member.tenant_id != tenant.pk:
        member = None  # never another tenant's membership (its models and limits)
    return Principal(tenant.pk, tenant.slug, tenant.active, key.pk, tuple(routes),
                     _target(default, learned, pools) if usable and default is not None else None, tenant.policy(),
                     tenant.limits(), key.limits(),
                     member_id=member.pk if member is not None else None,
                     member_username=member.user.get_username()[:150] if member is not None else "",
                     member_models=tuple(str(m) for m in member.allowed_models or ()) if member is not None else (),
                     member_limits=member.limits() if member is not None else Limits())


def parse_api_key(raw: str) -> str | None:
    """The prefix of a well-formed ``tr-<prefix>-<secret>`` key, else None."""
    parts = raw.split("-", 2)
    if len(parts) != 3 or parts[0] != API_KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


def api_key_authenticate(raw: str) -> ApiKey | None:
    """The usable ApiKey for ``raw`` (looked up by prefix, compared in constant time), else None.

    Wrong secret, revoked and expired keys all give None.
    """
    prefix = parse_api_key(raw)
    if prefix is None:
        return None
    key = ApiKey.objects.select_related("tenant", "member__user").filter(prefix=prefix).first()
    if key is None or not key.matches(raw) or not key.is_usable():
        return None
    if key.member_id and key.member is not None and not key.member.user.is_active:
        return None  # a person's key stops with their account
    return key


def principal_for_key(raw: str, *, refresh: bool = False) -> Principal | None:
    """Authenticate ``raw`` against the database and cache the answer (sync: a database thread).

    Returns the principal, or None for a key that cannot be used (its tenant may be disabled: see
    ``Principal.active``). ``refresh=True`` reads the database even when cached (refresh ahead).
    """
    if parse_api_key(raw) is None:
        return None
    digest = ApiKey.compute_digest(raw)
    if not refresh:
        found, principal = key_cache.get(digest)
        if found:
            return principal
    try:
        key = api_key_authenticate(raw)
        principal = _principal(key) if key is not None else None
        if key is not None:
            from tenants.services import api_key_touch

            api_key_touch(key=key)
        key_cache.put(digest, principal)
    finally:
        if refresh:
            key_cache.release(digest)
    return principal


class AuthUnavailable(Exception):
    """The key is not known and the database cannot be asked now: answer 503 with ``Retry-After``."""


#: Auth lookups run here, never in Channels' single database thread (shared with every other ORM call
#: of the process) and never on the event loop; each call is bounded (``infra.dbcall.bounded``).
_LOOKUPS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="toolrelay-auth")


def _lookup(raw: str, refresh: bool) -> Principal | None:
    """A database lookup from an auth thread; the answer becomes the key's last good one (or forgets it).

    The thread's connection is closed afterwards: lookups are rare (one per key per cache lifetime) and
    an idle connection per auth thread would outlive every use of it.
    """
    global _in_doubt
    try:
        principal = bounded(lambda: principal_for_key(raw, refresh=refresh), timeout=settings.DB_CALL_TIMEOUT_SECONDS)
    except BaseException:
        _in_doubt = True
        raise
    finally:
        connections.close_all()
    _in_doubt = False
    last_good.remember(ApiKey.compute_digest(raw), principal)
    return principal


async def _ask(raw: str, *, refresh: bool = False) -> Principal | None:
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_LOOKUPS, _lookup, raw, refresh)
    return await asyncio.wait_for(future, timeout=settings.DB_CALL_TIMEOUT_SECONDS + 1)


async def _refresh(raw: str) -> None:
    global _down_until, _in_doubt
    try:
        await _ask(raw, refresh=True)  # principal_for_key(refresh=True) releases the claim
    except Exception as exc:  # noqa: BLE001 - the cached answer stays until it expires; then the last good one
        logger.warning("API key refresh failed: %s", exc)
        _down_until = time.monotonic() + DOWN_SECONDS
        _in_doubt = True
        key_cache.release(ApiKey.compute_digest(raw))


#: Monotonic time until which the database is taken as down (a lookup just failed): lookups are not
#: waited for meanwhile; known keys get their last good answer at once, unknown ones a 503.
_down_until = 0.0
#: How long one failed lookup marks the database down (seconds).
DOWN_SECONDS = 2.0
#: How long a key this process knows, idle for a while, waits for its database lookup before its last good
#: answer is served (seconds): a healthy database answers in milliseconds, so a revocation is still seen at once.
#: A key in steady use, or any key while the database is in doubt, does not wait at all (``_known_key``).
KNOWN_KEY_WAIT = 0.25
#: True from a lookup that failed, or outlived ``KNOWN_KEY_WAIT``, until a lookup succeeds: the database is
#: down, slow or frozen, and no request waits for it (``_down_until`` lapses after ``DOWN_SECONDS``; a frozen
#: database makes each lookup take ``DB_CALL_TIMEOUT_SECONDS`` to fail, so that window alone left gaps).
_in_doubt = False


def _note_failure(future: asyncio.Future[Principal | None]) -> None:
    global _down_until, _in_doubt
    if not future.cancelled() and future.exception() is not None:
        _down_until = time.monotonic() + DOWN_SECONDS
        _in_doubt = True


async def _looked_up(raw: str, digest: str) -> Principal | None:
    """The database's answer, else (database down, slow or frozen) the key's last good principal.

    A key this process knows waits at most ``KNOWN_KEY_WAIT`` for the database: past it, its last good
    answer is served and the lookup goes on in its thread, its answer (a revocation too) replacing it.
    """
    global _down_until
    loop = asyncio.get_running_loop()
    remembered: Principal | None = last_good.recall_memory(digest)
    if remembered is not None and time.monotonic() >= _down_until:
        return await _known_key(raw, digest, remembered)
    if time.monotonic() < _down_until:
        return await _while_down(raw, digest)
    try:
        return await _ask(raw)
    except (DatabaseError, TimeoutError) as exc:
        _down_until = time.monotonic() + DOWN_SECONDS
        stale: Principal | None = await loop.run_in_executor(None, last_good.recall, digest)
        if stale is None:
            raise AuthUnavailable(str(exc)) from None
        logger.warning("database unavailable (%s): serving key %s from its last good answer", exc, digest[:8])
        key_cache.put(digest, stale)
        return stale


async def _known_key(raw: str, digest: str, remembered: Principal) -> Principal | None:
    """A key with a last good answer in this process.

    ``remembered`` at once, its lookup in the background (one at a time; its answer, a refusal too, replaces
    it), when the database is in doubt (a lookup failed or was slow, and none has succeeded since). Else the
    database's answer within ``KNOWN_KEY_WAIT``, then ``remembered`` (the lookup goes on; a failure of it marks
    the database in doubt). So with a healthy database a revocation, a disabled tenant or a changed route is
    seen as soon as the cached answer expires (``AUTH_CACHE_SECONDS``); with a frozen one, one request waits
    ``KNOWN_KEY_WAIT`` and the next ones do not wait at all.
    """
    global _down_until, _in_doubt
    if _in_doubt:
        key_cache.put(digest, remembered)
        if key_cache.claim(digest):
            schedule(_refresh(raw))
        return remembered
    future = asyncio.get_running_loop().run_in_executor(_LOOKUPS, _lookup, raw, False)
    done, _ = await asyncio.wait({future}, timeout=KNOWN_KEY_WAIT)
    if done:
        try:
            return future.result()
        except (DatabaseError, TimeoutError) as exc:
            _down_until = time.monotonic() + DOWN_SECONDS
            _in_doubt = True
            logger.warning("database unavailable (%s): serving key %s from its last good answer", exc,
                           digest[:8])
    else:
        _in_doubt = True  # slower than a healthy database: the next requests do not wait (cleared on success)
        future.add_done_callback(_note_failure)
    key_cache.put(digest, remembered)
    return remembered


async def _while_down(raw: str, digest: str) -> Principal:
    """The database failed a moment ago: the key's last good answer (shared store), one background
    refresh at a time; ``AuthUnavailable`` when there is none."""
    stale: Principal | None = await asyncio.get_running_loop().run_in_executor(None, last_good.recall, digest)
    if stale is None:
        raise AuthUnavailable("the database was unavailable a moment ago")
    key_cache.put(digest, stale)
    if key_cache.claim(digest):
        schedule(_refresh(raw))  # one background try at a time; its answer replaces the stale one
    return stale


async def authorize(raw: str) -> Principal:
    """The principal of API key ``raw``; ``KeyRefused`` when it cannot be used, ``AuthUnavailable`` when it
    is not known and the database cannot be asked.

    Safe on the event loop: a cached answer is returned at once (a refresh is scheduled past half its
    lifetime); a miss asks the database from an auth thread, bounded by ``DB_CALL_TIMEOUT_SECONDS``, and
    falls back to the key's last good answer within ``AUTH_STALE_SECONDS``.
    """
    revocation.listen()
    if parse_api_key(raw) is None:
        raise KeyRefused("invalid")
    digest = ApiKey.compute_digest(raw)
    found, principal = key_cache.get(digest)
    if not found:
        principal = await _looked_up(raw, digest)
    elif key_cache.claim_refresh(digest):
        schedule(_refresh(raw))
    if principal is None:
        raise KeyRefused("invalid")
    if not principal.active:
        raise KeyRefused("disabled")
    return principal
