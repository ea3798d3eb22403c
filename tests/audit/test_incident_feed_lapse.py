"""Issue 24 item 11: the live feed's socket follows its session and memberships, and checks its origin
exactly. The review: sockets kept streaming after logout, deactivation and membership removal, and the
origin check ignored port and scheme (3/10 foreign origins accepted). The real ASGI application of
``config/asgi.py`` with an admin session cookie, as in tests/audit/test_incident_feed.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.db import connections
from django.test import Client

from config.asgi import application
from tenants.models import Membership
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/admin/audit/incidents/ws"


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    yield
    await sync_to_async(connections.close_all)()


def _session(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return str(client.cookies[settings.SESSION_COOKIE_NAME].value)


async def _feed(key: str | None, origin: bytes, host: bytes = b"localhost") -> tuple[WebsocketCommunicator, bool]:
    headers = [(b"host", host), (b"origin", origin)]
    if key:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={key}".encode()))
    communicator = WebsocketCommunicator(application, PATH, headers=headers)
    accepted, _ = await communicator.connect(timeout=5)
    return communicator, accepted


@pytest.mark.parametrize("origin", [b"http://localhost:8001", b"https://localhost", b"http://localhost.evil.test",
                                    b"null", b"http://127.0.0.1", b""])
async def test_an_origin_that_is_not_exactly_the_feeds_own_is_refused(admin_a: Any, origin: bytes) -> None:
    key = await sync_to_async(_session)(admin_a)
    _, accepted = await _feed(key, origin)
    assert not accepted


@pytest.mark.parametrize("origin, host", [(b"http://localhost", b"localhost"), (b"http://localhost:80", b"localhost"),
                                          (b"http://localhost:8000", b"localhost:8000")])
async def test_the_feeds_own_origin_is_accepted(admin_a: Any, origin: bytes, host: bytes) -> None:
    key = await sync_to_async(_session)(admin_a)
    communicator, accepted = await _feed(key, origin, host)
    assert accepted
    await communicator.disconnect()


def _logout(user: Any, key: str) -> None:
    SessionStore(key).delete()


def _deactivate(user: Any, key: str) -> None:
    type(user).objects.filter(pk=user.pk).update(is_active=False)


def _remove_membership(user: Any, key: str) -> None:
    Membership.objects.filter(user=user).delete()


def _new_password(user: Any, key: str) -> None:
    fresh = type(user).objects.get(pk=user.pk)
    fresh.set_password("a-completely-new-password-77")
    fresh.save()


@pytest.mark.parametrize("lapse", [_logout, _deactivate, _remove_membership, _new_password])
async def test_the_socket_closes_when_its_session_or_membership_lapses(
        admin_a: Any, world_a: TenantWorld, settings: Any, lapse: Callable[[Any, str], None]) -> None:
    settings.LIVE_FEED_RECHECK_SECONDS = 0.1
    key = await sync_to_async(_session)(admin_a)
    communicator, accepted = await _feed(key, b"http://localhost")
    assert accepted
    await sync_to_async(lapse)(admin_a, key)
    closed = await communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4403}
    await communicator.wait(timeout=5)
