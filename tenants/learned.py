"""A fact learned about an upstream (``LearnedFact``), as stored, carried and shared.

The value type of what ``proxy.upstreams.learned`` learns from an upstream's refusal: rows of
``UpstreamLearnedLimit`` give it (``UpstreamLearnedLimit.fact``), principals carry it, the journal and
Redis share it. It lives here, below the proxy, because tenants' models and principals hold it.
``redis_key()`` is the Redis hash of every fact (``REDIS_KEY`` after the deployment's ``REDIS_PREFIX``);
``publish_now`` writes an operator's edit from sync code.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: The Redis hash of every fact: field ``<upstream id>|<model>|<parameter>``, value the fact as JSON.
#: The hash's name after the deployment's ``REDIS_PREFIX`` (``redis_key()``).
REDIS_KEY = "learned-limits"


def redis_key() -> str:
    """The Redis hash of every fact, under the deployment's ``REDIS_PREFIX``."""
    from django.conf import settings

    return f"{settings.REDIS_PREFIX}{REDIS_KEY}"


@dataclass(frozen=True, slots=True)
class LearnedFact:
    """One remembered fix for ``model`` on upstream ``upstream_id``: ``parameter`` at most ``limit`` (None:
    left out). ``learned_at`` / ``expires_at`` are unix seconds; ``detail`` the upstream's words."""

    upstream_id: int
    model: str
    parameter: str
    limit: int | None
    learned_at: float
    expires_at: float
    detail: str = ""

    @property
    def key(self) -> tuple[int, str, str]:
        return self.upstream_id, self.model, self.parameter

    def live(self, now: float) -> bool:
        """True while the fact holds (not yet expired)."""
        return self.expires_at > now


    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Any) -> LearnedFact | None:
        """The fact of a dict or its JSON text; None for anything else (never raises)."""
        try:
            values = json.loads(data) if isinstance(data, str | bytes) else data
            fact = cls(int(values["upstream_id"]), str(values["model"]), str(values["parameter"]),
                       None if values.get("limit") is None else int(values["limit"]),
                       float(values["learned_at"]), float(values["expires_at"]), str(values.get("detail", "")))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return fact


def redis_field(fact: LearnedFact) -> str:
    return f"{fact.upstream_id}|{fact.model}|{fact.parameter}"


def publish_now(fact: LearnedFact, url: str) -> None:
    """Write ``fact`` to Redis from sync code (the admin's edits), replacing what is there; logs failures."""
    import redis

    try:
        redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0).hset(
            redis_key(), redis_field(fact), fact.to_json())
    except Exception as exc:  # noqa: BLE001 - the principals carry the row within AUTH_CACHE_SECONDS anyway
        logger.warning("learned limit edit not written to Redis: %s", exc)
