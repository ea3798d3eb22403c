"""The cost of an attempt from its usage (pure): ``Price`` and ``cost_usd(usage, price)``.

Prices are USD per million tokens. ``input`` prices fresh input (``Usage.fresh_input``: neither read
from nor written to a cache), ``cache_read`` / ``cache_write`` the cached parts, ``output`` the output that
is not reasoning, ``reasoning`` the reasoning part. A part without its own price is charged at its
whole's (cache reads and writes at ``input``, reasoning at ``output``): never below what was spent
when the provider did not publish a separate rate, never $0.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from proxy.guard.checks.usage import Usage

PER = 1_000_000  # tokens a price is quoted for


@dataclass(frozen=True, slots=True)
class Price:
    """One price of the map: ``model`` and ``upstream`` globs (``upstream`` "" = any upstream), USD per
    million tokens, in force from ``since`` (Unix seconds); ``source``: where it comes from (a public
    page for the shipped defaults, ``operator`` for the operator's own); ``id``: its row (None: a default)."""

    model: str
    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None
    reasoning: float | None = None
    upstream: str = ""
    since: float = 0.0
    source: str = ""
    id: int | None = None

    def matches(self, model: str, upstream: str) -> bool:
        """True when this price applies to ``model`` served by ``upstream`` (globs, case-sensitive)."""
        return fnmatchcase(model, self.model) and (not self.upstream or fnmatchcase(upstream, self.upstream))

    @property
    def specificity(self) -> tuple[int, int]:
        """How narrow it is: upstream-specific first, then the longer literal part of the model glob."""
        literal = sum(1 for ch in self.model if ch not in "*?[]")
        return (1 if self.upstream else 0), literal


def cost_usd(usage: Usage, price: Price) -> float:
    """USD of ``usage`` at ``price`` (module docstring for which part is charged what); >= 0."""
    cache_read = price.input if price.cache_read is None else price.cache_read
    cache_write = price.input if price.cache_write is None else price.cache_write
    reasoning = price.output if price.reasoning is None else price.reasoning
    total = (
        usage.fresh_input * price.input
        + usage.cache_read * cache_read
        + usage.cache_write * cache_write
        + usage.plain_output * price.output
        + usage.reasoning * reasoning
    )
    return max(0.0, total / PER)


def estimate_usd(prompt_tokens: int, output_tokens: int, price: Price) -> float:
    """USD of a request before it runs: ``prompt_tokens`` at the input price, ``output_tokens`` at the output's."""
    return max(0.0, (max(0, prompt_tokens) * price.input + max(0, output_tokens) * price.output) / PER)


def pick(prices: tuple[Price, ...], model: str, upstream: str, when: float) -> Price | None:
    """The price in force at ``when`` for ``model`` at ``upstream``: among the prices that match and started by
    then, the most specific (``Price.specificity``; the operator's over a shipped default on a tie), and of
    those with the same globs the latest. None: unpriced."""
    best: Price | None = None
    best_rank: tuple[int, int, int, float] | None = None
    for price in prices:
        if price.since > when or not price.matches(model, upstream):
            continue
        rank = (*price.specificity, 1 if price.id is not None else 0, price.since)
        if best_rank is None or rank > best_rank:
            best, best_rank = price, rank
    return best
