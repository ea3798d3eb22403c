"""What a tenant's or a key's limits are: ``Limits`` (ORM-free; carried by the ``Principal``).

Each limit is None (none) or a whole number (0 blocks): ``rpm`` requests per minute, ``tpm`` input
plus output tokens per minute, ``concurrency`` requests in flight at once, ``daily_tokens`` and
``monthly_tokens`` tokens per UTC calendar day and month; ``daily_usd``, ``weekly_usd`` and
``monthly_usd`` money budgets in USD per UTC day, ISO week (from Monday) and calendar month, priced by
``billing`` (``proxy.policy.limits``: reserved before the upstream call, settled to the real cost after);
``money_soft_percent`` the holder's soft threshold for those budgets (percent, 1-100; None: 80), and
``daily_usd_soft_percent`` ... ``monthly_usd_soft_percent`` one budget's own (None: the holder's).
A key's (and a member's) limits apply within its tenant's: a request is checked against all of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: The limits, in the order of ``Limits``' fields, commands, admin and ``error.code``.
LIMIT_NAMES = ("rpm", "tpm", "concurrency", "daily_tokens", "monthly_tokens", "daily_usd", "weekly_usd", "monthly_usd")
#: The money budgets among them (USD amounts, not whole numbers).
MONEY_NAMES = ("daily_usd", "weekly_usd", "monthly_usd")
#: A holder's soft threshold for its money budgets: percent (1-100) of each budget past which the first request
#: records a ``money-budget-threshold`` finding (None: ``MONEY_SOFT_PERCENT``). Not a limit: it refuses nothing
#: and is not bounded by the tenant's.
SOFT_NAME = "money_soft_percent"
#: Per money budget, its own soft threshold (percent, 1-100; None: the holder's ``money_soft_percent``).
WINDOW_SOFT_NAMES = {name: f"{name}_soft_percent" for name in MONEY_NAMES}
#: Every soft threshold column: the holder's, then each budget's own.
SOFT_NAMES = (SOFT_NAME, *WINDOW_SOFT_NAMES.values())
#: Every column a holder's ``Limits`` reads: the limits and the soft thresholds (commands, admin, API).
HOLDER_NAMES = (*LIMIT_NAMES, *SOFT_NAMES)
#: The most USD a money budget may say (a typo guard).
MAX_USD = 10**9


def _value(name: str, value: Any) -> int | float | None:
    """A limit's value as ``Limits`` holds it: whole numbers, USD as float (a ``Decimal`` column too)."""
    if value is None or isinstance(value, bool):
        return None
    if name in SOFT_NAMES:
        return value if isinstance(value, int) and 1 <= value <= 100 else None
    if name in MONEY_NAMES:
        try:
            amount = float(value)
        except (TypeError, ValueError):
            return None
        return amount if 0 <= amount <= MAX_USD else None
    return value if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class Limits:
    """One holder's limits (None: no limit; 0: blocked)."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    daily_tokens: int | None = None
    monthly_tokens: int | None = None
    daily_usd: float | None = None
    weekly_usd: float | None = None
    monthly_usd: float | None = None
    money_soft_percent: int | None = None
    daily_usd_soft_percent: int | None = None
    weekly_usd_soft_percent: int | None = None
    monthly_usd_soft_percent: int | None = None

    @classmethod
    def of(cls, row: Any) -> Limits:
        """The limits of a row with the ``LIMIT_NAMES`` columns (``Tenant``, ``ApiKey``)."""
        return cls(**{name: _value(name, getattr(row, name, None)) for name in HOLDER_NAMES})  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, data: Any) -> Limits:
        """The limits ``as_json`` wrote (unknown or missing names: no limit)."""
        if not isinstance(data, dict):
            return cls()
        return cls(**{n: _value(n, v) for n, v in data.items() if n in HOLDER_NAMES})  # type: ignore[arg-type]

    def as_json(self) -> dict[str, int | float | None]:
        """``{"rpm": N | None, ..., "money_soft_percent": N | None, "daily_usd_soft_percent": N | None, ...}`` in
        ``HOLDER_NAMES`` order (``limits show --json``)."""
        return asdict(self)

    def soft_percent(self, budget: str) -> int | None:
        """The soft threshold of money budget ``budget`` (a ``MONEY_NAMES`` name): its own, else the holder's
        ``money_soft_percent``; None: neither is set (``MONEY_SOFT_PERCENT`` applies)."""
        own = getattr(self, WINDOW_SOFT_NAMES.get(budget, SOFT_NAME), None)
        return own if own is not None else self.money_soft_percent

    @property
    def money(self) -> bool:
        """True when a money budget is set."""
        return any(getattr(self, n) is not None for n in MONEY_NAMES)

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
