"""Revocation broadcast: a revoked key (or a changed or disabled tenant) is dropped by every process at once.

``key_revoked`` / ``tenant_changed`` run where the change is made (services, admin, commands): once the
transaction commits they drop the local auth cache and last-good entries, remove the shared last-good
copy, and publish on the shared state's ``auth-revoked`` channel (``infra.shared_state``: Redis pub/sub
when ``REDIS_URL`` is set, in process otherwise). Every proxy process subscribes on its first request
(``listen``) and drops the same entries when a message arrives, so a revoked key is refused everywhere
within the broadcast's latency (milliseconds) instead of ``AUTH_CACHE_SECONDS``. With Redis down the
message is lost and revocation falls back to the cache lifetime (the publish logs a warning).

Messages: ``key:<digest>`` (hex HMAC of the key, never the key) or ``tenant:<id>``.
"""

from __future__ import annotations

import logging

from django.db import transaction

from infra.shared_state import get_state

logger = logging.getLogger(__name__)

CHANNEL = "auth-revoked"
_listening: set[int] = set()  # id() of the shared-state instances subscribed to


def _drop(message: str) -> None:
    """Forget what ``message`` names in this process's auth cache and last-good memory."""
    from tenants import last_good
    from tenants.key_cache import key_cache

    kind, _, value = message.partition(":")
    if kind == "key" and value:
        key_cache.drop(value)
        last_good.forget(value)
    elif kind == "tenant" and value.isdigit():
        for digest in key_cache.drop_tenant(int(value)):
            last_good.forget(digest)
        last_good.forget_tenant(int(value))


def _publish(message: str, *, shared_digest: str | None = None) -> None:
    from tenants import last_good

    _drop(message)
    if shared_digest is not None:
        last_good.remember(shared_digest, None)  # the shared copy (Redis or the local file) too
    get_state().publish_sync(CHANNEL, message)


def key_revoked(digest: str) -> None:
    """Broadcast that the key with ``digest`` is no longer usable (after the current transaction commits)."""
    transaction.on_commit(lambda: _publish(f"key:{digest}", shared_digest=digest))


def tenant_changed(tenant_id: int) -> None:
    """Broadcast that tenant ``tenant_id``'s principals are stale (disabled, limits changed)."""
    transaction.on_commit(lambda: _publish(f"tenant:{tenant_id}"))


def listen() -> None:
    """Subscribe this process to the broadcast (idempotent; call on the event loop, cheap when done)."""
    state = get_state()
    if id(state) in _listening:
        return
    _listening.add(id(state))
    state.subscribe(CHANNEL, _drop)
