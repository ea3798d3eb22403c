"""One deployment prefix for every Redis name (issue 24 item 6), on a real Redis.

The review: two deployments on one Redis were not separated by ``LIMITS_KEY_PREFIX``: the channel layer's
groups, the learned limits, the last good principals and Celery's queues were unprefixed (deployment Y's
admin saw X's incidents; X's learned ``max_tokens`` clamped Y's upstream of the same id). Now
``REDIS_PREFIX`` names all of them. Each test writes through the real component under two prefixes in a
Redis database of its own and reads every key back.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
URL = os.environ.get("TEST_REDIS_PREFIX_URL", "redis://127.0.0.1:6379/13")
A, B = "deploy-x:", "deploy-y:"


@pytest.fixture
def db() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def _keys(client: redis.Redis) -> list[str]:
    return sorted(k.decode() for k in client.keys("*"))


def _settings_of(prefix_env: dict[str, str]) -> dict[str, Any]:
    code = ("import json, django; django.setup(); from django.conf import settings as s; "
            "print(json.dumps({'limits': s.LIMITS_KEY_PREFIX, 'redis': s.REDIS_PREFIX, "
            "'layer': s.CHANNEL_LAYERS['default']['CONFIG']['prefix'], "
            "'celery': s.CELERY_BROKER_TRANSPORT_OPTIONS}))")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_PREFIX", "LIMITS_KEY_PREFIX")}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "REDIS_URL": URL, **prefix_env})
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,  # noqa: S603
                         check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_settings_put_every_redis_name_under_one_prefix() -> None:
    values = _settings_of({"REDIS_PREFIX": A})
    assert values == {"limits": A, "redis": A, "layer": f"{A}asgi", "celery": {"global_keyprefix": A}}
    assert _settings_of({"LIMITS_KEY_PREFIX": B})["layer"] == f"{B}asgi", "the older name still sets it"


@pytest.mark.django_db
def test_last_good_principals_and_learned_limits_are_per_deployment(db: redis.Redis, settings: Any,
                                                                    world_a: Any) -> None:
    from tenants import last_good
    from tenants.auth import principal_for_key
    from tenants.learned import LearnedFact, publish_now

    settings.REDIS_URL = URL
    principal = principal_for_key(world_a.raw_key)
    fact = LearnedFact(world_a.upstream.pk, "m", "max_tokens", 8192, time.time(), time.time() + 60)
    settings.REDIS_PREFIX = A
    last_good.remember("digest-1", principal)
    publish_now(fact, URL)
    last_good.forget_all()
    assert last_good.recall("digest-1") is not None
    settings.REDIS_PREFIX = B
    last_good.forget_all()
    assert last_good.recall("digest-1") is None, "deployment Y does not see X's principal"
    assert _keys(db) == [f"{A}learned-limits", f"{A}principal:digest-1"]


def test_learned_limits_shared_by_one_deployment_are_not_pulled_by_another(db: redis.Redis, settings: Any) -> None:
    from proxy.upstreams.learned import RedisShare
    from tenants.learned import LearnedFact

    async def run() -> tuple[int, int]:
        settings.REDIS_PREFIX = A
        x = RedisShare(URL)
        await x.publish(LearnedFact(7, "m", "max_tokens", 8192, time.time(), time.time() + 60))
        settings.REDIS_PREFIX = B
        y = RedisShare(URL)
        seen = len(await y.pull()), len(await x.pull())
        await x.aclose()
        await y.aclose()
        return seen

    assert asyncio.run(run()) == (0, 1)
    assert _keys(db) == [f"{A}learned-limits"]


def test_the_channel_layer_and_celery_queues_use_the_prefix(db: redis.Redis) -> None:
    """With the settings' values (checked above), the libraries put every key under the prefix."""
    from channels_redis.core import RedisChannelLayer
    from kombu import Connection

    async def feed() -> None:
        layer = RedisChannelLayer(hosts=[URL], prefix=f"{A}asgi")
        await layer.group_add("incidents-tenant-1", "specific.abc!def")
        await layer.group_send("incidents-tenant-1", {"type": "incident"})
        await layer.close_pools()

    asyncio.run(feed())
    with Connection(URL, transport_options={"global_keyprefix": A}) as connection:
        queue = connection.SimpleQueue("celery")
        queue.put({"task": "probe"})
        queue.close()
    keys = _keys(db)
    assert keys and all(k.startswith(A) for k in keys), keys
