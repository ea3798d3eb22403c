"""Webhook bodies and signatures, shared by the tenants' alert webhooks and the operator's ``ALERT_WEBHOOK_URL``.

Bodies (``body(alert, fmt)``):

- ``slack``: ``{"text": "..."}``, which Slack incoming webhooks (and Mattermost, Discord's ``/slack``
  endpoint, Rocket.Chat) accept as a message (https://api.slack.com/messaging/webhooks);
- ``generic``: the alert itself, ``{"event", "rule", "tenant", "subject", "summary", "value",
  "threshold", "window_minutes", "at", "toolrelay": "alert/1"}`` (``value`` / ``threshold`` may be
  null; ``at`` is an ISO 8601 UTC time).

Signature: header ``X-Toolrelay-Signature: t=<unix seconds>,v1=<hex>`` where ``hex`` is
HMAC-SHA256 over ``"<t>." + body`` (the exact bytes sent) with the webhook's secret, the scheme
Stripe documents for its webhooks. A receiver recomputes it, compares in constant time, and refuses
a ``t`` too far from its clock (replays). ``X-Toolrelay-Event`` names the rule.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

SIGNATURE_HEADER = "X-Toolrelay-Signature"
EVENT_HEADER = "X-Toolrelay-Event"
FORMATS = ("slack", "generic")


def text_of(alert: dict[str, Any]) -> str:
    """The one-line message of ``alert`` (Slack's ``text``)."""
    where = f"{alert.get('tenant') or 'toolrelay'}"
    if alert.get("subject"):
        where += f" / {alert['subject']}"
    return f"[toolrelay] {where}: {alert.get('summary', '')}"


def body(alert: dict[str, Any], fmt: str) -> bytes:
    """The JSON body of ``alert`` in ``fmt`` (``slack`` or ``generic``), as the bytes that are signed and sent."""
    payload: dict[str, Any] = {"text": text_of(alert)} if fmt == "slack" else {**alert, "toolrelay": "alert/1"}
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def signature(secret: str, payload: bytes, *, timestamp: int | None = None) -> str:
    """The ``X-Toolrelay-Signature`` value of ``payload`` under ``secret``."""
    stamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode("utf-8"), f"{stamp}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={digest}"


def verify(secret: str, payload: bytes, header: str, *, tolerance: float = 300.0, now: float | None = None) -> bool:
    """True when ``header`` is a valid signature of ``payload`` made within ``tolerance`` seconds (for
    receivers and tests)."""
    parts = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        stamp = int(parts.get("t", ""))
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - stamp) > tolerance:
        return False
    expected = signature(secret, payload, timestamp=stamp).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


def headers(secret: str, payload: bytes, event: str) -> dict[str, str]:
    """The request headers of a webhook post (content type, event, signature when ``secret``)."""
    out = {"Content-Type": "application/json", "User-Agent": "toolrelay-alerts/1", EVENT_HEADER: event}
    if secret:
        out[SIGNATURE_HEADER] = signature(secret, payload)
    return out
