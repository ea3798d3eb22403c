"""The live incident feed under the real launcher (``manage.py serve``): an admin's browser-like WebSocket, opened
with the admin session cookie, receives the incident of a request that a real client ran out of retries on.

The WebSocket client is a minimal RFC 6455 one over a plain socket (handshake, unmasked server text frames),
enough to read what the server sends; the request goes through openai-python to the simulator.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from typing import Any

import openai
import pytest
from django.conf import settings
from django.test import Client

from tests.e2e.conftest import ProxyServer, TenantFixture
from tests.e2e.corpus import CASES, load_case

PATH = "/admin/audit/incidents/ws"


class WebSocket:
    """A blocking WebSocket client that reads text frames (RFC 6455 sections 4.1 and 5.2)."""

    def __init__(self, port: int, path: str, *, cookie: str, origin: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                           f"Origin: {origin}\r\nCookie: {cookie}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                break
            head += chunk
        self.status = int(head.split(b" ", 2)[1]) if head else 0

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def frame(self) -> tuple[int, bytes]:
        """The next frame's ``(opcode, payload)``."""
        first, second = self._exactly(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", self._exactly(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self._exactly(8))[0]
        return first & 0x0F, self._exactly(size)

    def close(self) -> None:
        self.sock.close()


def _admin_cookie(django_db_blocker: Any) -> str:
    from django.contrib.auth.models import User

    with django_db_blocker.unblock():
        user = User.objects.create_superuser(f"feed-{os.urandom(4).hex()}", "", "pw-feed-0123456789")
        client = Client()
        client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def test_the_launcher_serves_the_feed_and_streams_an_exhausted_request(
        make_tenant: Any, proxy_server: ProxyServer, django_db_blocker: Any) -> None:
    tenant: TenantFixture = make_tenant()
    socket_ = WebSocket(proxy_server.port, PATH, cookie=_admin_cookie(django_db_blocker),
                        origin=proxy_server.url)
    assert socket_.status == 101
    case = next(load_case(p) for p in CASES if load_case(p)["expected"]["action"] == "retry")
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0) as client, \
            client.chat.completions.stream(model=f"case:{case['id']}", tools=case["request_tools"],
                                        messages=[{"role": "user", "content": "go"}]) as stream:
        request_id = stream._response.headers["x-request-id"]
        with pytest.raises(openai.APIError, match="toolrelay"):  # the terminal error (exhaustion policy fail)
            for _ in stream:
                pass
    try:
        while True:
            opcode, payload = socket_.frame()
            assert opcode == 1, f"unexpected frame {opcode}: {payload!r}"
            item = json.loads(payload)["incident"]
            if item["kind"] == "exhausted" and item["request_id"] == request_id:
                break
    finally:
        socket_.close()
    assert item["tenant_id"] == tenant.tenant.pk


def test_the_launcher_refuses_a_feed_without_a_session(proxy_server: ProxyServer) -> None:
    """No session: the handshake is accepted by Daphne only to be closed, or refused outright; never a feed."""
    socket_ = WebSocket(proxy_server.port, PATH, cookie="sessionid=nothing", origin=proxy_server.url)
    try:
        if socket_.status == 101:
            opcode, payload = socket_.frame()
            assert opcode == 8 and struct.unpack("!H", payload[:2])[0] == 4403
        else:
            assert socket_.status == 403
    finally:
        socket_.close()
