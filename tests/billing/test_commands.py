"""``prices set|show`` and ``usage --json`` (issue 19 items 2 and 6) against real rows."""

from __future__ import annotations

import io
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import ProxyRequest
from billing import book


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_prices_set_then_show_json_and_versioned() -> None:
    _run("prices", "set", "--model", "sim-*", "--input", "1", "--output", "2", "--cache-read", "0.1")
    shown = json.loads(_run("prices", "show", "--json"))["prices"]
    mine = [p for p in shown if p["model"] == "sim-*"]
    assert mine == [{"model": "sim-*", "upstream": "", "input": 1.0, "output": 2.0, "cache_read": 0.1,
                     "cache_write": None, "reasoning": None, "since": mine[0]["since"], "source": "operator",
                     "operator": True}]
    assert any(p["model"] == "deepseek-chat" and p["source"].startswith("https://") for p in shown)
    _run("prices", "set", "--model", "sim-*", "--input", "3", "--output", "4", "--from", "2099-01-01")
    assert [p["input"] for p in json.loads(_run("prices", "show", "--json"))["prices"] if p["model"] == "sim-*"] \
        == [1.0]  # a future price is not in force yet
    loaded = book.load()
    assert loaded.price("sim-x").input == 1.0 and loaded.price("sim-x", when=4102444800 + 1).input == 3.0
    with pytest.raises(CommandError):
        _run("prices", "set", "--model", "x", "--input", "-1", "--output", "1")


def _request(world: Any, *, model: str, delivered: str, wasted: str, unpriced: bool = False,
             estimated: bool = False) -> None:
    d, w = Decimal(delivered), Decimal(wasted)
    ProxyRequest.objects.create(id=uuid.uuid4(), tenant=world.tenant, api_key=world.api_key, model=model,
                                path="guarded", outcome="clean", attempts=2 if w else 1, delivered_usd=d,
                                wasted_usd=w, cost_usd=d + w, unpriced=unpriced, usage_estimated=estimated)


def test_usage_json_has_exactly_the_issue_shape(world_a: Any, world_b: Any) -> None:
    _request(world_a, model="m1", delivered="0.000025", wasted="0")
    _request(world_a, model="m1", delivered="0.000025", wasted="0.000025")
    _request(world_a, model="m2", delivered="0", wasted="0", unpriced=True, estimated=True)
    _request(world_b, model="m1", delivered="1", wasted="1")
    ProxyRequest.objects.create(id=uuid.uuid4(), tenant=world_a.tenant, model="m1", path="guarded",
                                outcome="rejected", status=429, attempts=0)
    figures = json.loads(_run("usage", "--tenant", world_a.tenant.slug, "--json"))
    assert list(figures) == ["tenant", "requests", "cost_usd", "delivered_usd", "wasted_usd", "unpriced_requests",
                             "estimated_requests", "by_model", "by_member"]
    assert figures["tenant"] == world_a.tenant.name and figures["requests"] == 3
    assert figures["cost_usd"] == pytest.approx(75e-6) and figures["delivered_usd"] == pytest.approx(50e-6)
    assert figures["wasted_usd"] == pytest.approx(25e-6)
    assert (figures["unpriced_requests"], figures["estimated_requests"]) == (1, 1)
    assert figures["by_model"][0] == {"model": "m1", "requests": 2, "cost_usd": pytest.approx(75e-6),
                                      "wasted_usd": pytest.approx(25e-6)}
    assert isinstance(figures["by_member"], list)
    assert json.loads(_run("usage", "--tenant", world_a.tenant.slug, "--since", "2099-01-01", "--json"))[
        "requests"] == 0
