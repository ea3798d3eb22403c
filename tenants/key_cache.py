"""The process's cache of principals by key digest (``key_cache``): what ``tenants.auth.authorize``
answers from, and what ``tenants.revocation`` drops entries of when a key or tenant changes."""

from __future__ import annotations

import threading
import time

from django.conf import settings

from tenants.principal import Principal


class _KeyCache:
    """A tiny TTL cache of principals keyed by the key's digest (the raw key is never kept).

    ``get`` answers hits; ``claim_refresh`` tells one caller when a live entry is past half its
    lifetime; ``put`` stores an answer (None = refused) for ``AUTH_CACHE_SECONDS``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal | None]] = {}
        self._refreshing: set[str] = set()

    def get(self, digest: str) -> tuple[bool, Principal | None]:
        with self._lock:
            hit = self._entries.get(digest)
        if hit is None or hit[0] < time.monotonic():
            return False, None
        return True, hit[1]

    def claim_refresh(self, digest: str) -> bool:
        """True, for one caller, when ``digest``'s live entry is past half its lifetime."""
        with self._lock:
            hit = self._entries.get(digest)
            remaining = hit[0] - time.monotonic() if hit is not None else 0.0
            if not 0 < remaining <= settings.AUTH_CACHE_SECONDS / 2 or digest in self._refreshing:
                return False
            self._refreshing.add(digest)
            return True

    def claim(self, digest: str) -> bool:
        """True, for one caller, when no refresh of ``digest`` is under way (release it when done)."""
        with self._lock:
            if digest in self._refreshing:
                return False
            self._refreshing.add(digest)
            return True

    def put(self, digest: str, principal: Principal | None) -> None:
        expires = time.monotonic() + settings.AUTH_CACHE_SECONDS
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[digest] = (expires, principal)

    def release(self, digest: str) -> None:
        """A refresh of ``digest`` ended (renewed or failed): the next one may be claimed."""
        with self._lock:
            self._refreshing.discard(digest)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._refreshing.clear()

    def drop(self, digest: str) -> None:
        """Forget ``digest``'s answer (a revocation broadcast): the next request asks the database."""
        with self._lock:
            self._entries.pop(digest, None)

    def drop_tenant(self, tenant_id: int) -> list[str]:
        """Forget every cached principal of tenant ``tenant_id``; return their digests."""
        with self._lock:
            gone = [d for d, (_, p) in self._entries.items() if p is not None and p.tenant_id == tenant_id]
            for digest in gone:
                del self._entries[digest]
        return gone


key_cache = _KeyCache()
