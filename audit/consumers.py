"""The live incident feed's WebSocket (``/admin/audit/incidents/ws``): incidents of the user's tenants as they happen.

Authenticated by the admin session (``AuthMiddlewareStack`` in ``config/asgi.py``, behind
``AllowedHostsOriginValidator``) with the admin's own rule: active staff who see some tenant, and a
second factor where the admin asks for one (``tenants.admin_site.otp_required``). Scoped like every
audit view (``tenants.scoping``): a member joins the groups of
their tenants, a superuser ``incidents.all``; everyone also joins ``incidents.system`` (the journal's
state, no tenant data). Memberships are read when the socket opens and again every
``LIVE_FEED_RECHECK_SECONDS`` with the session (issue 24 item 11): a socket whose session ended (logout,
expiry, a password change), whose user was deactivated or lost every membership is closed with 4403;
lost tenants stop reaching it at once. A tenant's incident is checked against the current memberships
before it is sent. A refused socket is closed with code 4403. The ``Origin`` is checked exactly before
the handshake (``audit.origin``).

Messages to the browser: ``{"type": "incident", "incident": {...}}`` (``audit.incidents`` shapes).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.utils.crypto import constant_time_compare
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.models import Device

from audit import incident_feed
from tenants.admin_site import OIDC_BACKEND, otp_required
from tenants.scoping import scope_for_user

logger = logging.getLogger(__name__)

#: WebSocket close code for "not allowed" (4000-4999 are the application's own, RFC 6455 section 7.4.2).
REFUSED = 4403


def _verified(user: Any, session: Any) -> bool:
    """Has this session passed the second factor the admin asks ``user`` for (django-otp's rule)?"""
    from django.contrib.auth import BACKEND_SESSION_KEY

    if session.get(BACKEND_SESSION_KEY) == OIDC_BACKEND:
        return not user.is_superuser  # as the admin: single sign-on never stands in for a superuser's code
    if not otp_required(user):
        return True
    persistent_id = session.get(DEVICE_ID_SESSION_KEY)
    device = Device.from_persistent_id(persistent_id) if persistent_id else None
    return device is not None and device.user_id == user.pk and device.confirmed


def feed_scope(user: Any, session: Any) -> frozenset[int] | None | bool:
    """What ``user`` may watch: None for every tenant (superusers), the ids of their tenants, or False
    (not allowed: not active staff, no tenant, or a second factor missing). Sync: a database thread."""
    if user is None or session is None or not getattr(user, "is_authenticated", False):
        return False
    if not (user.is_active and user.is_staff) or not _verified(user, session):
        return False
    ids = scope_for_user(user).seen
    return ids if ids is None else ids or False


def current_scope(user_id: Any, session_key: str | None) -> frozenset[int] | None | bool:
    """``feed_scope`` again from the database: the session as stored now (False when it is gone, belongs to
    another user, or its password hash no longer matches the user's) and the user as it is now. Sync."""
    from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model

    if not session_key:
        return False
    engine = importlib.import_module(settings.SESSION_ENGINE)
    data = engine.SessionStore(session_key).load()
    user = get_user_model().objects.filter(pk=user_id).first()
    if user is None or str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    if not constant_time_compare(str(data.get(HASH_SESSION_KEY, "")), user.get_session_auth_hash()):
        return False
    return feed_scope(user, data)


class IncidentConsumer(AsyncJsonWebsocketConsumer):
    """One admin's live feed."""

    tenants: frozenset[int] | None = frozenset()
    joined: tuple[str, ...] = ()
    watcher: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        scope = await database_sync_to_async(feed_scope)(self.scope.get("user"), self.scope.get("session"))
        if scope is False:
            await self.close(code=REFUSED)
            return
        self.tenants = scope if isinstance(scope, frozenset) else None
        incident_feed.note_consumer_loop(asyncio.get_running_loop())
        await self._join(self._groups(self.tenants))
        await self.accept()
        self.watcher = asyncio.ensure_future(self._recheck())

    @staticmethod
    def _groups(tenants: frozenset[int] | None) -> list[str]:
        groups = [incident_feed.SYSTEM]
        return groups + ([incident_feed.ALL] if tenants is None else [incident_feed.tenant_group(t)
                                                                       for t in sorted(tenants)])

    async def _join(self, groups: list[str]) -> None:
        for group in [g for g in self.joined if g not in groups]:
            await self.channel_layer.group_discard(group, self.channel_name)
        for group in [g for g in groups if g not in self.joined]:
            await self.channel_layer.group_add(group, self.channel_name)
        self.joined = tuple(groups)

    async def _recheck(self) -> None:
        """Every ``LIVE_FEED_RECHECK_SECONDS``: the session and memberships as they are now; close when they
        lapsed, follow them when they changed."""
        user = self.scope.get("user")
        session = self.scope.get("session")
        user_id, key = getattr(user, "pk", None), getattr(session, "session_key", None)
        while True:
            await asyncio.sleep(float(settings.LIVE_FEED_RECHECK_SECONDS))
            try:
                scope = await database_sync_to_async(current_scope)(user_id, key)
            except Exception as exc:  # noqa: BLE001 - the database is unreachable: keep the last answer, ask again
                logger.warning("live feed: session re-check failed (%s); asked again later", type(exc).__name__)
                continue
            if scope is False:
                await self.close(code=REFUSED)
                return
            self.tenants = scope if isinstance(scope, frozenset) else None
            await self._join(self._groups(self.tenants))

    async def disconnect(self, code: int) -> None:
        if self.watcher is not None and self.watcher is not asyncio.current_task():
            self.watcher.cancel()
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = ()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The browser sends nothing the feed needs; anything it sends is ignored."""

    async def incident(self, event: dict[str, Any]) -> None:
        """An incident from the channel layer: sent on when it is one of this user's tenants (or the system's)."""
        item = event.get("incident")
        if not isinstance(item, dict):
            return
        tenant = item.get("tenant_id")
        if tenant is not None and self.tenants is not None and tenant not in self.tenants:
            return
        await self.send_json({"type": "incident", "incident": item})
