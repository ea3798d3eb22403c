"""Last-good principals: what lets the proxy keep serving known keys while the database is down.

Every principal the database confirmed is kept for ``AUTH_STALE_SECONDS`` (default 15 min) where
this process, a restarted one and a sibling find it: Redis when ``REDIS_URL`` is set (one key per
API key digest, with that TTL), else a file next to the journal (``JOURNAL_DIR/principals.json``,
written atomically). A key the database refused is removed at once, so the stale window never
brings back a revoked key. Upstream credentials stay encrypted, as in the ``Principal`` itself.
Blocking I/O: called from the auth lookup threads only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from proxy.guard.policy import Exhaustion, FragmentStorage, GuardPolicy, Repair
from tenants.limits import Limits

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_memory: dict[str, tuple[float, Any]] = {}
_REDIS_NAME = "principal:"  # after the deployment's REDIS_PREFIX


def _policy(data: dict[str, Any]) -> GuardPolicy:
    """A policy from its plain values (fields a principal stored before they existed take their defaults)."""
    known = {f.name for f in dataclasses.fields(GuardPolicy)}
    return GuardPolicy(**{**{k: v for k, v in data.items() if k in known},
                          "exhaustion": Exhaustion(data["exhaustion"]),
                          "fragments": FragmentStorage(data["fragments"]),
                          "repairs": frozenset(Repair(r) for r in data["repairs"]),
                          "loop_exempt_tools": frozenset(str(t) for t in data.get("loop_exempt_tools", ()))})


def _target(data: dict[str, Any]) -> Any:
    """An ``UpstreamTarget`` from its plain values (its learned limits as ``LearnedFact``; none in a
    principal stored before they existed)."""
    from tenants.learned import LearnedFact
    from tenants.principal import UpstreamTarget

    learned = tuple(f for f in (LearnedFact.from_json(v) for v in data.get("learned", ())) if f is not None)
    keys = tuple((str(k[0]), str(k[1]), int(k[2])) for k in data.get("keys", ()))
    return UpstreamTarget(**{**data, "learned": learned, "keys": keys})


def dumps(principal: Any) -> str:
    """A principal as JSON (policies, targets and routes as plain values)."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, frozenset):
            return sorted(str(v) for v in value)
        return value
    return json.dumps(plain(principal))


def loads(text: str) -> Any:
    """The principal ``dumps`` wrote."""
    from tenants.principal import Principal, Route

    data = json.loads(text)
    routes = tuple(Route(r["route_id"], r["public_name"], r["is_glob"],
                         tuple((_target(t), m) for t, m in r["targets"]), r["max_output_tokens"],
                         _policy(r["policy"]), r.get("request_deadline"), prefer=str(r.get("prefer") or "order"),
                         retry_target=str(r.get("retry_target") or ""),
                         continue_text=bool(r.get("continue_text"))) for r in data["routes"])
    default = _target(data["default_target"]) if data["default_target"] else None
    return Principal(data["tenant_id"], data["slug"], data["active"], data["api_key_id"], routes, default,
                     _policy(data["policy"]), Limits.from_json(data.get("limits")),
                     Limits.from_json(data.get("key_limits")), member_id=data.get("member_id"),
                     member_username=str(data.get("member_username") or ""),
                     member_models=tuple(str(m) for m in data.get("member_models") or ()),
                     member_limits=Limits.from_json(data.get("member_limits")))


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)


def _file() -> Path:
    return Path(settings.JOURNAL_DIR) / "principals.json"


def _read_file() -> dict[str, Any]:
    try:
        data = json.loads(_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_file(update: dict[str, Any | None]) -> None:
    path = _file()
    path.parent.mkdir(parents=True, exist_ok=True)
    now = time.time()
    data = {k: v for k, v in _read_file().items() if isinstance(v, list) and now - v[0] < settings.AUTH_STALE_SECONDS}
    for digest, principal in update.items():
        if principal is None:
            data.pop(digest, None)
        else:
            data[digest] = [now, dumps(principal)]
    tmp = path.with_name(f".principals.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def remember(digest: str, principal: Any | None) -> None:
    """Keep ``principal`` as the last good answer for ``digest`` (None: the key was refused, forget it)."""
    with _lock:
        if principal is None:
            _memory.pop(digest, None)
        else:
            _memory[digest] = (time.monotonic(), principal)
    try:
        if settings.REDIS_URL:
            client = _redis()
            key = settings.REDIS_PREFIX + _REDIS_NAME + digest
            if principal is None:
                client.delete(key)
            else:
                client.set(key, dumps(principal), ex=int(settings.AUTH_STALE_SECONDS))
        else:
            with _lock:
                _write_file({digest: principal})
    except Exception as exc:  # noqa: BLE001 - the shared copy is a convenience; memory still has it
        logger.warning("last-good principal not shared: %s", exc)


def recall_memory(digest: str) -> Any | None:
    """This process's last good principal of ``digest`` (no I/O: safe on the event loop), else None."""
    with _lock:
        hit = _memory.get(digest)
    if hit is not None and time.monotonic() - hit[0] < settings.AUTH_STALE_SECONDS:
        return hit[1]
    return None


def recall(digest: str) -> Any | None:
    """The last good principal of ``digest`` within ``AUTH_STALE_SECONDS``, else None."""
    with _lock:
        hit = _memory.get(digest)
    if hit is not None and time.monotonic() - hit[0] < settings.AUTH_STALE_SECONDS:
        return hit[1]
    try:
        if settings.REDIS_URL:
            raw = _redis().get(settings.REDIS_PREFIX + _REDIS_NAME + digest)
            return loads(raw.decode()) if raw else None
        entry = _read_file().get(digest)
        if isinstance(entry, list) and time.time() - entry[0] < settings.AUTH_STALE_SECONDS:
            return loads(entry[1])
    except Exception as exc:  # noqa: BLE001 - nothing shared to fall back on
        logger.warning("last-good principal not readable: %s", exc)
    return None


def known() -> bool:
    """True when this process has any last-good principal in memory (for /readyz)."""
    with _lock:
        now = time.monotonic()
        return any(now - stamp < settings.AUTH_STALE_SECONDS for stamp, _ in _memory.values())


def forget(digest: str) -> None:
    """Drop this process's copy of ``digest`` (a revocation broadcast; the shared copy is removed by the
    process that revoked)."""
    with _lock:
        _memory.pop(digest, None)


def forget_tenant(tenant_id: int) -> None:
    """Drop this process's copies of tenant ``tenant_id``'s principals."""
    with _lock:
        for digest in [d for d, (_, p) in _memory.items() if getattr(p, "tenant_id", None) == tenant_id]:
            del _memory[digest]


def forget_all() -> None:
    """Drop the in-process copies (tests)."""
    with _lock:
        _memory.clear()
