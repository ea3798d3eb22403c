"""The live incident feed's WebSocket (``/admin/audit/incidents/ws``): incidents of the user's tenants as they happen.

Authenticated by the admin session (``AuthMiddlewareStack`` in ``config/asgi.py``, behind
``AllowedHostsOriginValidator``) with the admin's own rule: active staff who see some tenant, and a
second factor where the admin asks for one (``tenants.admin_site.otp_required``). Scoped like every
audit view (``audit.scoping`` -> ``tenants.selectors.tenants_for_user``): a member joins the groups of
their tenants, a superuser ``incidents.all``; everyone also joins ``incidents.system`` (the journal's
state, no tenant data). Memberships are read when the socket opens; a tenant's incident is checked
against them again before it is sent. A refused socket is closed with code 4403.

Messages to the browser: ``{"type": "incident", "incident": {...}}`` (``audit.incidents`` shapes).
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.models import Device

from audit import incident_feed
from tenants.admin_site import OIDC_BACKEND, otp_required
from tenants.selectors import tenants_for_user

#: WebSocket close code for "not allowed" (4000-4999 are the application's own, RFC 6455 section 7.4.2).
REFUSED = 4403


def _verified(user: Any, session: Any) -> bool:
    """Has this session passed the second factor the admin asks ``user`` for (django-otp's rule)?"""
    from django.contrib.auth import BACKEND_SESSION_KEY

    if session.get(BACKEND_SESSION_KEY) == OIDC_BACKEND or not otp_required(user):
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
    if user.is_superuser:
        return None
    ids = frozenset(tenants_for_user(user).values_list("pk", flat=True))
    return ids or False


class IncidentConsumer(AsyncJsonWebsocketConsumer):
    """One admin's live feed."""

    tenants: frozenset[int] | None = frozenset()
    joined: tuple[str, ...] = ()

    async def connect(self) -> None:
        scope = await database_sync_to_async(feed_scope)(self.scope.get("user"), self.scope.get("session"))
        if scope is False:
            await self.close(code=REFUSED)
            return
        self.tenants = scope if isinstance(scope, frozenset) else None
        groups = [incident_feed.SYSTEM]
        groups += [incident_feed.ALL] if self.tenants is None else [incident_feed.tenant_group(t)
                                                                     for t in sorted(self.tenants)]
        incident_feed.note_consumer_loop(asyncio.get_running_loop())
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.joined = tuple(groups)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)

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
