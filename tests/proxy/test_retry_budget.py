"""The tenant retry budget and the loop breaker's session state, in the relay (MockTransport upstream, real
database, the shared state in process memory; the Redis case of the shared state is the limits module's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from audit.models import Finding, ProxyRequest
from infra.background import drain_background
from infra.shared_state import MemoryState, RedisState, reset_state
from proxy.guard.decisions.loops import STUCK_PREFIX
from proxy.policy.retry_budget import count_request, take_retry
from tests.proxy.test_relay import (  # noqa: F401 - the fixtures
    BROKEN,
    TEXT,
    _close_thread_connections,
    make_request,
    run,
    upstream,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_state() -> Iterator[None]:
    reset_state(MemoryState())
    yield
    reset_state(None)


async def test_retries_are_allowed_up_to_the_share_of_requests(settings: Any) -> None:
    """Four requests at 50%: two retries, then none; the floor gives a new tenant its first ones."""
    settings.RETRY_BUDGET_MIN_RETRIES = 0
    for _ in range(4):
        count_request(7001)
    await drain_background()
    assert [(await take_retry(7001, 50)).allowed for _ in range(3)] == [True, True, False]
    refused = await take_retry(7001, 50)
    assert (refused.calls, refused.retries, refused.allowance) == (4, 2, 2)
    assert "retry budget is spent" in refused.finding(50).detail
    settings.RETRY_BUDGET_MIN_RETRIES = 3
    assert [(await take_retry(7002, 50)).allowed for _ in range(4)] == [True, True, True, False]
    assert (await take_retry(7001, 50)).allowed, "the floor applies to every tenant"


async def test_the_budget_fails_open_when_the_shared_state_cannot_be_asked(settings: Any) -> None:
    settings.RETRY_BUDGET_MIN_RETRIES = 0
    reset_state(RedisState("redis://127.0.0.1:1/0"))  # nothing listens there
    assert (await take_retry(7003, 0)).allowed


async def test_past_the_budget_a_broken_answer_gets_one_attempt_and_the_exhaustion_answer(
        make_request: Any, settings: Any) -> None:  # noqa: F811
    settings.RETRY_BUDGET_MIN_RETRIES = 0
    request = make_request(max_retries=2)
    broken = [(0, TEXT("Working")), (0, BROKEN)]
    recorder, response = await run(request, upstream(broken, broken, broken))
    assert "[toolrelay]" in recorder.said() and "retry budget is spent" in recorder.said()
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.outcome == "exhausted" and row.attempts == 1
    kinds = await sync_to_async(list)(Finding.objects.filter(request_id=row.id).values_list("kind", flat=True))
    assert "retry-budget-spent" in kinds


async def test_within_the_budget_broken_answers_are_retried(make_request: Any, settings: Any) -> None:  # noqa: F811
    settings.RETRY_BUDGET_MIN_RETRIES = 0
    request = make_request(max_retries=1)
    request = dataclasses.replace(request, principal=dataclasses.replace(
        request.principal, policy=dataclasses.replace(request.principal.policy, retry_budget_percent=500)))
    broken = [(0, BROKEN)]
    recorder, response = await run(request, upstream(broken, broken))
    row = await sync_to_async(ProxyRequest.objects.get)(id=response.request_id)
    assert row.outcome == "exhausted" and row.attempts == 2
    assert "retry budget" not in recorder.text()


async def test_the_third_exhausted_turn_in_a_row_gets_the_stuck_answer(make_request: Any) -> None:  # noqa: F811
    """The history shows nothing (the client re-sends the same request): the session state counts the turns."""
    broken = [(0, BROKEN)]
    texts = []
    for _ in range(3):
        request = dataclasses.replace(make_request(max_retries=0), session="h:test-session")
        recorder, response = await run(request, upstream(broken))
        texts.append(recorder.said())
    assert all("could not produce a valid answer" in t for t in texts[:2])
    assert texts[2].startswith(STUCK_PREFIX) and "3 turns in a row" in texts[2]
    kinds = await sync_to_async(list)(Finding.objects.filter(request_id=response.request_id)
                                      .values_list("kind", flat=True))
    assert "agent-loop" in kinds
