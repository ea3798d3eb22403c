"""What a tenant's or a key's limits are: ``Limits`` (ORM-free; carried by the ``Principal``).

Each limit is None (none) or a whole number (0 blocks): ``rpm`` requests per minute, ``tpm`` input
plus output tokens per minute, ``concurrency`` requests in flight at once, ``daily_tokens`` and
``monthly_tokens`` tokens per UTC calendar day and month. A key's limits apply within its tenant's:
a request is checked against both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: The limits, in the order of ``Limits``' fields, commands, admin and ``error.code``.
LIMIT_NAMES = ("rpm", "tpm", "concurrency", "daily_tokens", "monthly_tokens")


@dataclass(frozen=True, slots=True)
class Limits:
    """One holder's limits (None: no limit; 0: blocked)."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    daily_tokens: int | None = None
    monthly_tokens: int | None = None

    @classmethod
    def of(cls, row: Any) -> Limits:
        """The limits of a row with the ``LIMIT_NAMES`` columns (``Tenant``, ``ApiKey``)."""
        return cls(**{name: getattr(row, name) for name in LIMIT_NAMES})

    @classmethod
    def from_json(cls, data: Any) -> Limits:
        """The limits ``as_json`` wrote (unknown or missing names: no limit)."""
        if not isinstance(data, dict):
            return cls()
        return cls(**{n: v for n, v in data.items() if n in LIMIT_NAMES and (v is None or isinstance(v, int))})

    def as_json(self) -> dict[str, int | None]:
        """``{"rpm": N | None, ...}`` in ``LIMIT_NAMES`` order (``limits show --json``)."""
        return asdict(self)

    @property
    def any(self) -> bool:
        """True when at least one limit is set."""
        return any(getattr(self, n) is not None for n in LIMIT_NAMES)


def above_tenant(key: Limits, tenant: Limits) -> list[str]:
    """The names of ``key``'s limits above (or set where the tenant blocks with 0) its ``tenant``'s.

    A key limit is refused when the tenant has that limit and the key's is larger: the key could
    never use it. ``[]`` when every key limit fits.
    """
    return [n for n in LIMIT_NAMES
            if getattr(key, n) is not None and getattr(tenant, n) is not None and getattr(key, n) > getattr(tenant, n)]
