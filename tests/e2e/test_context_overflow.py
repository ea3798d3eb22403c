"""A context-window refusal reaches each client in the words it heals from (issue 23, item 3).

The simulator answers as vLLM does when the prompt alone overflows the window
(``refuse=vllm-context/50``: no output budget can fit it, so toolrelay's clamp cannot help): Claude Code's
SDK gets Anthropic's own ``invalid_request_error`` "prompt is too long: P tokens > L maximum" (what it
compacts on), OpenAI and Responses clients the code ``context_length_exceeded`` (a streaming Responses
client in ``response.failed``, the only place Codex reads it).
"""

from __future__ import annotations

import re
from typing import Any

import anthropic
import openai
import pytest

OVERFLOW = "gen:calls=1:refuse=vllm-context/50"
LONG = "Please read the whole repository and explain it. " * 20
TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


def test_claude_codes_sdk_gets_anthropics_prompt_is_too_long(make_tenant: Any) -> None:
    tenant = make_tenant()
    with anthropic.Anthropic(base_url=tenant.base_url.removesuffix("/v1"), api_key=tenant.api_key,
                             max_retries=0, timeout=30) as client, pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=OVERFLOW, max_tokens=32000, messages=[{"role": "user", "content": LONG}],
                               tools=[{"name": "read_file", "description": "Read a file",
                                       "input_schema": TOOL["function"]["parameters"]}])  # type: ignore
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    match = re.match(r"prompt is too long: (\d+) tokens > (\d+) maximum", body["error"]["message"])
    assert match and int(match.group(2)) == 50 and int(match.group(1)) > 50


@pytest.mark.parametrize("stream", [True, False])
def test_openai_clients_get_the_context_length_exceeded_code(make_tenant: Any, stream: bool) -> None:
    tenant = make_tenant()
    with openai.OpenAI(base_url=tenant.base_url, api_key=tenant.api_key, max_retries=0, timeout=30) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=OVERFLOW, messages=[{"role": "user", "content": LONG}],
                                           tools=[TOOL], stream=stream)  # type: ignore[call-overload]
        assert caught.value.code == "context_length_exceeded"
        if not stream:
            with pytest.raises(openai.BadRequestError) as responses:
                client.responses.create(model=OVERFLOW, input=LONG)
            assert responses.value.code == "context_length_exceeded"
            return
        # Codex reads the overflow only from response.failed (codex-rs/codex-api/src/sse/responses.rs)
        with client.responses.create(model=OVERFLOW, input=LONG, stream=True) as events:
            kinds = [(e.type, e) for e in events]
        assert [k for k, _ in kinds] == ["response.created", "response.in_progress", "response.failed"]
        failed = kinds[-1][1].response  # type: ignore[union-attr]
        assert failed.status == "failed" and failed.error is not None
        assert failed.error.code == "context_length_exceeded"
        assert re.match(r"prompt is too long: \d+ tokens > 50 maximum", failed.error.message)
