"""The simulator's ``refuse=`` upstream families against the proxy's reading of them: every family's
refusal is understood (``proxy.upstreams.refusals``), and the fixed body is one the simulator accepts. The two
modules share no code, so each checks the other."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from proxy.simulator import refusals as sim
from proxy.simulator import start_in_thread
from proxy.upstreams.refusals import apply, classify

BODY: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 32000, "tool_choice": "required",
                        "stream_options": {"include_usage": True}, "parallel_tool_calls": True,
                        "reasoning_effort": "high", "temperature": 0.2, "top_k": 20,
                        "messages": [{"role": "user", "content": "hello " * 200}],
                        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
ARGS = {"deepseek-max-tokens": "8192", "dashscope-max-tokens": "8192", "groq-max-tokens": "16384",
        "zhipu-max-tokens": "4095", "openrouter-max-tokens": "8192", "opaque-max-tokens": "8192",
        "vllm-context": "16384", "sglang-context": "16384", "moonshot-context": "16384", "vllm-field": "top_k"}


def _without(body: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = {**body, **changes}
    return {k: v for k, v in merged.items() if v is not None or k not in changes}


@pytest.mark.parametrize("name", sim.names())
def test_each_family_is_understood_and_its_fix_is_accepted(name: str) -> None:
    value = f"{name}/{ARGS[name]}" if name in ARGS else name
    refused = sim.refusal(value, BODY)
    assert refused is not None, "the simulator refuses the body that carries the parameter"
    understood = classify(refused.status, refused.encoded(), BODY)
    if name.startswith("opaque-"):
        assert understood is None, "a refusal that names nothing goes to the client"
        return
    assert understood is not None, refused.body
    fixed = _without(BODY, apply(BODY, understood.fixes))
    assert sim.refusal(value, fixed) is None, (understood, fixed.get("max_tokens"))


def test_a_body_without_the_parameter_is_answered() -> None:
    assert sim.refusal("deepseek-max-tokens/8192", {**BODY, "max_tokens": 4096}) is None
    assert sim.refusal("vllm-tool-choice", {**BODY, "tool_choice": "auto"}) is None


def test_bad_refuse_values_are_scenario_errors() -> None:
    with pytest.raises(ValueError, match="known"):
        sim.parse("nobody-max-tokens/1")
    with pytest.raises(ValueError, match="token count"):
        sim.parse("deepseek-max-tokens")


def test_the_running_simulator_refuses_and_records_it() -> None:
    with start_in_thread(port=0) as running:
        url = f"{running.url}/chat/completions"
        model = "gen:refuse=deepseek-max-tokens/8192"
        refused = httpx.post(url, json={**BODY, "model": model})
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == ("Invalid max_tokens value, the valid range of max_tokens "
                                                      "is [1, 8192]")
        answered = httpx.post(url, json={**BODY, "model": model, "max_tokens": 8192, "stream": False})
        assert answered.status_code == 200 and answered.json()["object"] == "chat.completion"
        bad = httpx.post(url, json={**BODY, "model": "gen:refuse=nobody"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_scenario"
        records = running.stats()["requests"]
        assert [(r["status"], r["fault"], r["body"]["max_tokens"]) for r in records[:2]] == [
            (400, "refused:deepseek-max-tokens", 32000), (200, None, 8192)]
        assert json.dumps(records[0]["body"]["messages"]) == json.dumps(BODY["messages"])
