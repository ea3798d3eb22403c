"""``infra.metrics``: the label set (tenant, route, upstream names; bounded), the helpers the relay
calls, and the older call shapes that keep working until it does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from infra import metrics


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(autouse=True)
def _fresh_label_budget() -> Iterator[None]:
    metrics.bounded.clear()
    yield
    metrics.bounded.clear()


def test_a_request_is_counted_by_tenant_route_upstream_path_and_outcome() -> None:
    labels = metrics.request_labels(tenant="acme", route="claude-*", upstream="deepseek", path="guarded")
    series = {"tenant": "acme", "route": "claude-*", "upstream": "deepseek", "path": "guarded"}
    before = _value("toolrelay_requests_total", **series, outcome="recovered-by-retry")
    attempts = _value("toolrelay_upstream_attempts_total", **series, outcome="retry")
    metrics.observe_attempt(labels, upstream="deepseek", outcome="retry", ttfb=0.2, findings=["arguments-not-json"])
    metrics.observe_retry(labels, upstream="deepseek", cause="broken_output")
    metrics.observe_attempt(labels, upstream="deepseek", outcome="clean", ttfb=0.1)
    metrics.observe_request(labels, outcome="recovered-by-retry", ttft=1.5, added_latency=1.2)
    assert _value("toolrelay_requests_total", **series, outcome="recovered-by-retry") == before + 1
    assert _value("toolrelay_upstream_attempts_total", **series, outcome="retry") == attempts + 1
    assert _value("toolrelay_retries_total", **series, cause="broken_output") >= 1
    assert _value("toolrelay_added_latency_seconds_count", **series) >= 1
    assert _value("toolrelay_upstream_ttfb_seconds_count", upstream="deepseek") >= 2


def test_the_default_upstream_and_refused_requests_have_fixed_route_names() -> None:
    served = metrics.request_labels(tenant="acme", route=None, upstream="default", path="pass-through")
    refused = metrics.request_labels(tenant="acme", route="x", upstream="y", path="guarded", routed=False)
    assert (served.route, served.upstream) == ("default", "default")
    assert (refused.route, refused.upstream) == ("none", "none")


def test_label_values_are_bounded_and_printable() -> None:
    """Past LABEL_VALUES_MAX distinct values a label reads "other"; control characters are dropped."""
    values = [metrics.bounded("route", f"r{n}") for n in range(metrics.LABEL_VALUES_MAX + 5)]
    assert values[: metrics.LABEL_VALUES_MAX] == [f"r{n}" for n in range(metrics.LABEL_VALUES_MAX)]
    assert set(values[metrics.LABEL_VALUES_MAX:]) == {"other"}
    assert metrics.bounded("route", "r1") == "r1"
    assert metrics.bounded("tenant", "a\nb\x00c" + "x" * 300) == "abc" + "x" * 97
    assert metrics.bounded("cause", "") == "unknown"


def test_the_older_call_shapes_still_count() -> None:
    """``observe_request(tenant, path, outcome, ttft)``, ``ATTEMPTS.labels(outcome=…)`` and
    ``UPSTREAM_TTFB.observe(s)``: route and upstream are "unknown" until the relay passes them."""
    before = _value("toolrelay_requests_total", tenant="t", route="unknown", upstream="unknown", path="guarded",
                    outcome="clean")
    metrics.observe_request("t", "guarded", "clean", 0.1)
    metrics.ATTEMPTS.labels(outcome="clean").inc()
    metrics.UPSTREAM_TTFB.observe(0.05)
    assert _value("toolrelay_requests_total", tenant="t", route="unknown", upstream="unknown", path="guarded",
                  outcome="clean") == before + 1
    assert _value("toolrelay_upstream_attempts_total", tenant="unknown", route="unknown", upstream="unknown",
                  path="unknown", outcome="clean") >= 1
    assert _value("toolrelay_upstream_ttfb_seconds_count", upstream="unknown") >= 1
