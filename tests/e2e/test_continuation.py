"""Cut text streams continued (issue 21 item 5; docs/routing.md "Cut text streams continued"), over a real
Daphne server with the simulator's ``cut=F`` scenario as upstream and the openai and anthropic SDKs as
clients: a stream cut at 60% continues to 100% and the joined text equals the uncut generation exactly;
with the capability or the route's opt-in off, the client gets today's in-stream error."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from proxy.simulator.cut import generation
from tests.e2e.conftest import TenantFixture

USER: list[Any] = [{"role": "user", "content": "tell me about the seam"}]


def expected(chars: int = 600) -> str:
    """The uncut generation the simulator makes for ``USER`` (seed 0)."""
    return generation(0, USER, chars)


@pytest.fixture
def routed(make_tenant: Any, django_db_blocker: Any) -> Any:
    """A tenant whose ``cut=*`` models go to the simulator on a route with ``continue_text`` as asked, the
    upstream continuing trailing assistant messages in ``shape`` ("" = not at all)."""

    def make(*, shape: str, continue_text: bool = True) -> TenantFixture:
        from tenants.models import ModelRoute

        tenant = make_tenant()
        with django_db_blocker.unblock():
            tenant.upstream.text_continuation = shape
            tenant.upstream.save()
            ModelRoute.objects.create(tenant=tenant.tenant, public_name="cut=*", upstream=tenant.upstream,
                                      continue_text=continue_text)
        return tenant  # type: ignore[no-any-return]

    return make


def stream_text(tenant: TenantFixture, model: str) -> tuple[str, list[Any]]:
    """The text of a streamed OpenAI Chat answer and its chunks (raises what the SDK raises)."""
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30) as client:
        chunks: list[Any] = list(client.chat.completions.create(model=model, messages=USER, stream=True))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


@pytest.mark.parametrize(("shape", "how"), [("deepseek-prefix", "drop"), ("continue-final-message", "eof"),
                                            ("deepseek-prefix", "eof"), ("continue-final-message", "drop")])
def test_pass_through_cut_at_60_percent_continues_to_the_whole_text(routed: Any, simulator: Any,
                                                                    django_db_blocker: Any, shape: str,
                                                                    how: str) -> None:
    tenant = routed(shape=shape)
    text, chunks = stream_text(tenant, f"cut=0.6:how={how}")
    assert text == expected()
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1  # one stream to the client
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    asked = [r["body"] for r in simulator.stats()["requests"] if r["scenario"] == f"cut=0.6:how={how}"][-2:]
    prefix = asked[1]["messages"][-1]
    assert prefix["role"] == "assistant" and text.startswith(prefix["content"]) and prefix["content"]
    assert 0.4 * len(text) < len(prefix["content"]) < 0.7 * len(text)
    if shape == "deepseek-prefix":
        assert prefix["prefix"] is True and "continue_final_message" not in asked[1]
    else:
        assert asked[1]["continue_final_message"] is True and asked[1]["add_generation_prompt"] is False
    outcome, kinds = finished_row(tenant, django_db_blocker)
    assert outcome == "recovered-by-retry"
    assert "text-continued" in kinds


@pytest.mark.parametrize(("shape", "continue_text"), [("", True), ("deepseek-prefix", False)])
def test_pass_through_without_capability_or_opt_in_ends_with_the_in_stream_error(routed: Any, shape: str,
                                                                                 continue_text: bool) -> None:
    tenant = routed(shape=shape, continue_text=continue_text)
    with pytest.raises(openai.APIError, match="broke off|without a finish reason"):
        stream_text(tenant, "cut=0.6:how=drop")


def messages_text(proxy_server: Any, tenant: TenantFixture, model: str) -> tuple[str, Any]:
    """The streamed text and final message of an Anthropic Messages answer (raises what the SDK raises)."""
    with anthropic.Anthropic(base_url=proxy_server.url, api_key=tenant.api_key, max_retries=0, timeout=30) as client, \
            client.messages.stream(model=model, max_tokens=1000, messages=USER) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message()


@pytest.mark.parametrize("shape", ["continue-final-message", "deepseek-prefix"])
def test_anthropic_messages_cut_at_60_percent_continues_to_the_whole_text(routed: Any, proxy_server: Any,
                                                                          simulator: Any, django_db_blocker: Any,
                                                                          shape: str) -> None:
    # Every fresh attempt is cut (no broken=N): only a continuation can finish this stream.
    tenant = routed(shape=shape)
    text, final = messages_text(proxy_server, tenant, "cut=0.6:how=drop")
    assert text == expected()
    assert final.stop_reason == "end_turn"
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == expected()
    asked = [r["body"] for r in simulator.stats()["requests"] if r["scenario"] == "cut=0.6:how=drop"][-2:]
    assert asked[0]["messages"] == USER and asked[1]["messages"][:-1] == USER
    assert text.startswith(asked[1]["messages"][-1]["content"])
    outcome, kinds = finished_row(tenant, django_db_blocker)
    assert outcome == "recovered-by-retry"
    assert "text-continued" in kinds


def test_anthropic_messages_without_capability_get_todays_answer(routed: Any, proxy_server: Any) -> None:
    tenant = routed(shape="")
    with pytest.raises(anthropic.APIError):
        messages_text(proxy_server, tenant, "cut=0.6:how=drop")


def finished_row(tenant: TenantFixture, django_db_blocker: Any) -> tuple[str, set[str]]:
    """The outcome and finding kinds of the tenant's one request, once the journal wrote it."""
    import time

    from audit.models import ProxyRequest

    deadline = time.monotonic() + 15
    with django_db_blocker.unblock():
        while True:
            row = ProxyRequest.objects.filter(tenant=tenant.tenant).exclude(outcome="pending").first()
            if row is not None and row.attempt_rows.count() == row.attempts or time.monotonic() > deadline:
                assert row is not None
                return row.outcome, {f.kind for f in row.findings.all()}
            time.sleep(0.05)


def test_seam_quality_over_cut_points(routed: Any, proxy_server: Any, django_db_blocker: Any) -> None:
    """The figures of docs/routing.md: cut points from 5% to 95%, both shapes, the three ways to cut
    (a dropped connection, an end without finish reason, an idle timeout), the pass-through (openai) and
    the guarded path (anthropic); every joined text is checked against the uncut generation."""
    import time

    exact, total, times = 0, 0, []
    tenants = {shape: routed(shape=shape) for shape in ("deepseek-prefix", "continue-final-message")}
    with django_db_blocker.unblock():
        for tenant in tenants.values():
            tenant.upstream.idle_timeout = 1.0  # the stall is seen as an idle timeout after 1 s
            tenant.upstream.save()
    for number, fraction in enumerate((0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95)):
        for tenant in tenants.values():
            how = ("drop", "eof", "stall")[number % 3]
            model = f"cut={fraction}:how={how}:ms=5000:chars={200 + 40 * number}"
            want = generation(0, USER, 200 + 40 * number)
            started = time.monotonic()
            got = stream_text(tenant, model)[0] if number % 2 == 0 else messages_text(proxy_server, tenant, model)[0]
            times.append(time.monotonic() - started)
            total += 1
            exact += got == want
    print(f"\nseam quality: {exact}/{total} joined texts equal to the uncut generation; "
          f"request time median {sorted(times)[len(times) // 2]:.2f} s, max {max(times):.2f} s")
    assert exact == total
