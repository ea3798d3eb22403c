"""Claude Code's cost tracking and context meter read ``message_start`` and the last ``message_delta``
(issue 23 item 3): the prompt's input tokens at the start (the upstream's when it counts them on its first
chunk, vLLM ``continuous_usage_stats``; toolrelay's count of the request otherwise, never zero,
vercel/ai#17326), the real totals with the cache fields at the end; usage on every chunk closes no block
(router-for-me/CLIProxyAPI#5419). Checked with the anthropic SDK's own stream over a real Daphne server."""

from __future__ import annotations

from typing import Any

import anthropic

TOOL = {"name": "read_file", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
PROMPT = "Read the file README.md and tell me what the project does. " * 10


def _stream(tenant: Any, model: str) -> tuple[dict[str, int], anthropic.types.Message]:
    with anthropic.Anthropic(base_url=tenant.base_url.removesuffix("/v1"), api_key=tenant.api_key,
                             max_retries=0, timeout=30) as client:
        with client.messages.stream(model=model, max_tokens=1024, tools=[TOOL],  # type: ignore[list-item]
                                    messages=[{"role": "user", "content": PROMPT}]) as stream:
            start: dict[str, int] = {}
            for event in stream:
                if event.type == "message_start":
                    start = event.message.usage.model_dump(exclude_none=True)
            return start, stream.get_final_message()


def test_message_start_carries_the_upstreams_early_prompt_count(make_tenant: Any) -> None:
    start, final = _stream(make_tenant(), "gen:calls=1:usage=900/7/600:usage-every=1")
    assert (start["input_tokens"], start["cache_read_input_tokens"], start["output_tokens"]) == (300, 600, 0)
    usage = final.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_input_tokens) == (300, 7, 600)
    calls = [b for b in final.content if b.type == "tool_use"]
    assert len(calls) == 1 and isinstance(calls[0].input, dict) and isinstance(calls[0].input.get("path"), str), \
        "usage on every chunk must not close the tool_use block before its arguments"


def test_message_start_counts_the_request_when_the_upstream_counts_late(make_tenant: Any) -> None:
    start, final = _stream(make_tenant(), "gen:calls=1:usage=900/7/600")
    # toolrelay's count of the request (count_prompt: about 4 characters a token of English), never 0
    assert len(PROMPT) // 8 <= start["input_tokens"] <= len(PROMPT)
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.cache_read_input_tokens) == (300, 7, 600)


def test_message_start_and_count_tokens_give_one_count(make_tenant: Any) -> None:
    """The late-counting upstream's ``message_start`` says what ``count_tokens`` says of the same request
    (one function, ``proxy.guard.checks.token_count.count_prompt``): Claude Code's context meter and its
    pre-flight count agree."""
    tenant, model = make_tenant(), "gen:calls=1:usage=900/7/600"
    start, _final = _stream(tenant, model)
    with anthropic.Anthropic(base_url=tenant.base_url.removesuffix("/v1"), api_key=tenant.api_key,
                             max_retries=0, timeout=30) as client:
        counted = client.messages.count_tokens(model=model, tools=[TOOL],  # type: ignore[list-item]
                                               messages=[{"role": "user", "content": PROMPT}])
    assert start["input_tokens"] == counted.input_tokens
