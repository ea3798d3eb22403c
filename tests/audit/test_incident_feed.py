"""The live incident feed end to end in one process: the relay journals a request, the journal writer thread
sees its records and publishes the incident on the channel layer, and the admin's WebSocket (the real ASGI
application of ``config/asgi.py``, authenticated by an admin session cookie) receives it; scoped by
membership (a member of B never receives A's incidents).
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connections
from django.db.utils import OperationalError
from django.test import Client

from audit import journal_writer
from audit import records as audit
from config.asgi import application
from infra import webhook
from proxy.edge.protocols import OPENAI_CHAT
from proxy.edge.response import ClientResponse
from proxy.guard.checks.request import prepare
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter
from proxy.relay.loop import Relay, RelayCall, drain_background
from proxy.upstreams.client import UpstreamClient
from tenants.auth import principal_for_key
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/admin/audit/incidents/ws"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
BROKEN = b"data: {not json\n\n"


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    from audit import incident_feed

    incident_feed._paused_until = 0.0  # no pause left behind by an earlier test's failed send
    yield
    await sync_to_async(connections.close_all)()


def _cookie(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()


async def feed(user: Any | None, *, origin: bytes = b"http://localhost") -> tuple[WebsocketCommunicator, bool, Any]:
    """A WebSocket to the feed as ``user`` (None: no session): ``(communicator, accepted, close code)``."""
    headers = [(b"host", b"localhost"), (b"origin", origin)]
    if user is not None:
        headers.append((b"cookie", await sync_to_async(_cookie)(user)))
    communicator = WebsocketCommunicator(application, PATH, headers=headers)
    accepted, code = await communicator.connect(timeout=5)
    return communicator, accepted, code


def journal_exhausted(world: TenantWorld) -> str:
    """Journal a request of ``world``'s tenant that ran out of retries (as the relay does); its id."""
    record = audit.RequestRecord(id=uuid.uuid4(), tenant_id=world.tenant.pk, api_key_id=world.api_key.pk,
                                 model="coder", path="guarded", upstream_id=world.upstream.pk)
    audit.request_started(request=record)
    audit.request_finished(request=record, result=audit.RequestResult(
        outcome="exhausted", status=200, attempts=3, error="arguments were not JSON"))
    return str(record.id)


async def exhaust_through_the_relay(world: TenantWorld) -> str:
    """A real guarded request of ``world``'s tenant whose two attempts are broken; its request id."""
    principal = await sync_to_async(principal_for_key)(world.raw_key)
    assert principal is not None
    plan = principal.resolve(world.route.public_name)
    assert plan is not None
    plan = dataclasses.replace(plan, policy=dataclasses.replace(plan.policy, max_retries=1))
    body = {"model": world.route.public_name, "stream": True, "tools": TOOLS,
            "messages": [{"role": "user", "content": "hi"}]}
    call = RelayCall(principal=principal, plan=plan, request=prepare(body),
                     emitter=OpenAIChatEmitter(model="m", include_usage=False))

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=httpx.ByteStream(BROKEN))

    async def send(message: dict[str, Any]) -> None:
        return None

    response = ClientResponse(send, error_body=OPENAI_CHAT.error_body)
    await Relay(call, response, UpstreamClient(transport=httpx.MockTransport(handler))).run()
    await drain_background()
    return str(response.request_id)


async def next_incident(communicator: WebsocketCommunicator, kind: str) -> dict[str, Any]:
    """The next incident of ``kind`` the socket receives (others are skipped), within 5 s."""
    while True:
        message = await communicator.receive_json_from(timeout=5)
        assert message["type"] == "incident"
        if message["incident"]["kind"] == kind:
            return dict(message["incident"])


async def test_a_member_receives_the_incident_of_a_request_the_relay_exhausted(admin_a: Any,
                                                                              world_a: TenantWorld) -> None:
    """Relay -> journal -> writer thread -> channel layer -> WebSocket, within seconds."""
    communicator, accepted, _ = await feed(admin_a)
    assert accepted
    request_id = await exhaust_through_the_relay(world_a)
    item = await next_incident(communicator, "exhausted")
    assert item["request_id"] == request_id and item["tenant_id"] == world_a.tenant.pk
    assert item["upstream_id"] == world_a.upstream.pk and "2 attempt" in item["title"]
    await communicator.disconnect()


async def test_a_member_of_b_never_receives_an_incident_of_a(admin_a: Any, outsider_b: Any, world_a: TenantWorld,
                                                            world_b: TenantWorld) -> None:
    """A's incident reaches A's member only; B's member gets B's own (so the feed works for B)."""
    feed_a, _, _ = await feed(admin_a)
    feed_b, accepted, _ = await feed(outsider_b)
    assert accepted
    a_request = journal_exhausted(world_a)
    assert (await next_incident(feed_a, "exhausted"))["request_id"] == a_request
    assert await feed_b.receive_nothing(timeout=0.5)
    b_request = journal_exhausted(world_b)
    assert (await next_incident(feed_b, "exhausted"))["request_id"] == b_request
    assert await feed_a.receive_nothing(timeout=0.5)
    for communicator in (feed_a, feed_b):
        await communicator.disconnect()


async def test_a_superuser_receives_every_tenants_incidents(superuser: Any, world_a: TenantWorld,
                                                           world_b: TenantWorld) -> None:
    communicator, _, _ = await feed(superuser)
    ids = {journal_exhausted(world_a), journal_exhausted(world_b)}
    got = {(await next_incident(communicator, "exhausted"))["request_id"] for _ in range(2)}
    assert got == ids
    await communicator.disconnect()


async def test_it_refuses_sessions_that_may_not_see_the_audit(world_a: TenantWorld, django_user_model: Any,
                                                             admin_a: Any) -> None:
    """No session, a non-staff user, staff without a tenant: closed with 4403; another site's page: refused."""
    plain = await sync_to_async(django_user_model.objects.create_user)("plain", password="pw-plain-123456")
    lonely = await sync_to_async(django_user_model.objects.create_user)("lonely", password="pw-lonely-12345",
                                                                        is_staff=True)
    for user in (None, plain, lonely):
        _, accepted, code = await feed(user)
        assert (accepted, code) == (False, 4403)
    _, accepted, _ = await feed(admin_a, origin=b"https://evil.example")
    assert not accepted


class Receiver(http.server.BaseHTTPRequestHandler):
    """Records every POST (headers and body) into ``Receiver.seen``."""

    seen: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        Receiver.seen.append((dict(self.headers.items()), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        return None


@pytest.fixture
def receiver() -> Iterator[str]:
    """A real HTTP server on loopback; yields its URL."""
    Receiver.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


async def test_the_journal_not_draining_reaches_every_viewer_and_the_operators_webhook(
        viewer_a: Any, outsider_b: Any, receiver: str, settings: Any) -> None:
    """The writer's database state change is a process incident (both tenants' members get it) and one signed
    post to ``ALERT_WEBHOOK_URL``, from the web process itself."""
    settings.ALERT_WEBHOOK_URL, settings.ALERT_WEBHOOK_SECRET = receiver, "operator-secret-0123456789"
    settings.ALERT_WEBHOOK_FORMAT = "generic"
    feeds = [(await feed(user))[0] for user in (viewer_a, outsider_b)]
    journal_writer.journal()
    writer = journal_writer.writer()
    assert writer is not None
    # What the writer thread calls on a failed batch and on the next good one (called from a thread, as there).
    await sync_to_async(writer._failed)(OperationalError("the database went away"))
    try:
        for communicator in feeds:
            item = await next_incident(communicator, "journal-not-draining")
            assert item["tenant_id"] is None and "went away" in item["detail"]
    finally:
        await sync_to_async(writer._ok)()
    for communicator in feeds:
        assert (await next_incident(communicator, "journal-draining"))["tenant_id"] is None
        await communicator.disconnect()
    for _ in range(100):
        if len(Receiver.seen) >= 2:
            break
        await _sleep(0.05)
    events = [json.loads(body)["event"] for _, body in Receiver.seen]
    assert sorted(events) == ["journal-draining", "journal-not-draining"]
    head, body = Receiver.seen[0]
    assert webhook.verify("operator-secret-0123456789", body, head["X-Toolrelay-Signature"])


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def test_the_feed_runs_over_redis_as_in_compose(admin_a: Any, outsider_b: Any, world_a: TenantWorld,
                                                      settings: Any) -> None:
    """With ``REDIS_URL`` the layer is channels-redis: the writer thread publishes through Redis (its own event
    loop) and the socket receives through it; still A's only."""
    from tests.audit.conftest import ensure_redis

    await sync_to_async(ensure_redis)()
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {
        "hosts": ["redis://127.0.0.1:6379/12"], "prefix": f"tr-test-{uuid.uuid4().hex[:8]}"}}}
    feed_a, accepted, _ = await feed(admin_a)
    feed_b, _, _ = await feed(outsider_b)
    assert accepted
    request_id = journal_exhausted(world_a)
    assert (await next_incident(feed_a, "exhausted"))["request_id"] == request_id
    assert await feed_b.receive_nothing(timeout=0.5)
    for communicator in (feed_a, feed_b):
        await communicator.disconnect()
