"""The price map's rule and the cost of an attempt (issue 19 item 2): pure, no database."""

from __future__ import annotations

import pytest

from billing.book import PriceBook, defaults
from billing.cost import Price, cost_usd, pick
from proxy.guard.checks.usage import read_usage


def test_acceptance_price_is_25_micro_dollars() -> None:
    usage = read_usage({"prompt_tokens": 11, "completion_tokens": 7})
    assert cost_usd(usage, Price("*", input=1.0, output=2.0)) == pytest.approx(25e-6)


def test_cache_and_reasoning_parts_have_their_prices_or_their_wholes() -> None:
    usage = read_usage(
        {
            "prompt_tokens": 1_000_000,
            "completion_tokens": 1_000_000,
            "prompt_tokens_details": {"cached_tokens": 600_000, "cache_creation_input_tokens": 100_000},
            "completion_tokens_details": {"reasoning_tokens": 500_000},
        }
    )
    full = Price("m", input=1.0, output=2.0, cache_read=0.1, cache_write=1.25, reasoning=4.0)
    assert cost_usd(usage, full) == pytest.approx(0.3 + 0.06 + 0.125 + 1.0 + 2.0)
    plain = Price("m", input=1.0, output=2.0)  # no separate rates: charged at input / output, never $0
    assert cost_usd(usage, plain) == pytest.approx(1.0 + 2.0)


def test_most_specific_operator_latest_price_wins() -> None:
    prices = (
        Price("*", 1, 1, id=1),
        Price("deepseek-*", 2, 2, id=2),
        Price("deepseek-chat", 3, 3),
        Price("deepseek-chat", 4, 4, upstream="cheap*", id=3),
        Price("deepseek-chat", 5, 5, id=4, since=100),
        Price("deepseek-chat", 6, 6, id=5, since=200),
    )
    assert pick(prices, "gpt-x", "a", when=1000).input == 1
    assert pick(prices, "deepseek-v3", "a", when=1000).input == 2
    assert pick(prices, "deepseek-chat", "cheap-one", when=1000).input == 4
    assert pick(prices, "deepseek-chat", "other", when=50).input == 3  # the operator's start later
    assert pick(prices, "deepseek-chat", "other", when=150).input == 5  # versioned: the one in force then
    assert pick(prices, "deepseek-chat", "other", when=250).input == 6
    assert pick((), "m", "u", when=0) is None


def test_unpriced_is_none_never_zero() -> None:
    book = PriceBook((Price("known", 1, 1),))
    assert book.cost(read_usage({"prompt_tokens": 5, "completion_tokens": 5}), model="other") is None
    assert book.cost(read_usage({"prompt_tokens": 0, "completion_tokens": 0}), model="known") == 0.0


def test_shipped_defaults_have_date_and_public_source() -> None:
    shipped = defaults()
    assert len(shipped) >= 10
    for price in shipped:
        assert price.source.startswith("https://") and price.since > 0 and price.input > 0 and price.output > 0
    book = PriceBook(shipped)
    assert book.price("deepseek-chat") is not None and book.price("claude-sonnet-4-5-20250929") is not None
