"""Every family's context-window refusal (tests/corpus/context_overflow.json) reaches each client as it heals.

The readings asserted are the clients' own, copied from their code as patterns (not their code):

- Claude Code 2.1.197 (the bundle of ``@anthropic-ai/claude-code``): on an HTTP 400 whose error message
  matches ``input length and `max_tokens` exceed context limit: (\\d+) \\+ (\\d+) > (\\d+)`` it retries with
  ``max_tokens`` = L - P - 1000 when that is at least 3000; a message holding ``prompt is too long``
  becomes its "Prompt is too long" error, which starts its reactive compaction, and
  ``prompt is too long[^0-9]*(\\d+)\\s*tokens?\\s*>\\s*(\\d+)`` gives the gap to cut. The SDK's error message
  is the status and the JSON of the body, so the patterns are searched in that.
- Codex (openai/codex ``codex-rs/codex-api/src/sse/responses.rs``): ``response.failed`` whose
  ``response.error.code`` is ``context_length_exceeded`` is ``ContextWindowExceeded``; an HTTP 400 is an
  ordinary invalid request (``api_bridge.rs``), so a streaming Responses request gets the stream's error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from proxy.guard.decisions.answer import AnswerKind, answer_for
from proxy.guard.policy import GuardPolicy
from proxy.guard.protocols.emit_anthropic import error_body as anthropic_error_body
from proxy.guard.protocols.emit_responses import OpenAIResponsesEmitter
from proxy.guard.stream.errors import http_error_decision
from proxy.guard.stream.sse import SSEDecoder

CASES = json.loads((Path(__file__).parents[2] / "corpus" / "context_overflow.json").read_text())["cases"]
BUDGET_RE = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")
TOO_LONG_RE = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.I)


def _answer(case: dict[str, Any], *, stream: bool, in_stream: bool) -> Any:
    decision = http_error_decision(case["status"], json.dumps(case["body"]).encode(), {})
    return answer_for(decision, committed=False, stream=stream, checked=True, policy=GuardPolicy(), attempts=1,
                      request_id="req_1", prompt_tokens=case["prompt_estimate"], budget=case["sent_max_tokens"],
                      overflow_in_stream=in_stream)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_claude_code_reads_the_refusal_as_it_heals_from_it(case: dict[str, Any]) -> None:
    answer = _answer(case, stream=True, in_stream=False)
    assert answer.kind is AnswerKind.HTTP_ERROR and answer.error is not None
    assert (answer.error.status, answer.error.type) == (400, "invalid_request_error")
    body = anthropic_error_body(answer.error.status, f"{answer.error.message} (request id: req_1)")
    assert body["error"]["type"] == "invalid_request_error"
    sdk_message = f"400 {json.dumps(body)}"  # what the SDK's APIError.message holds
    want = case["anthropic"]
    budget, too_long = BUDGET_RE.search(sdk_message), TOO_LONG_RE.search(sdk_message)
    if want["kind"] == "budget":
        assert budget is not None and too_long is None, sdk_message
        prompt, output, limit = map(int, budget.groups())
        assert (prompt, output, limit) == (want["prompt"], want["output"], want["limit"])
        assert prompt + output > limit, "Claude Code only lowers a budget that overflowed"
    else:
        assert too_long is not None and budget is None, sdk_message
        prompt, limit = map(int, too_long.groups())
        assert (prompt, limit) == (want["prompt"], want["limit"]) and prompt > limit


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_codex_gets_context_window_exceeded_from_the_stream(case: dict[str, Any]) -> None:
    answer = _answer(case, stream=True, in_stream=True)
    assert answer.kind is AnswerKind.STREAM_ERROR and answer.error is not None
    emitter = OpenAIResponsesEmitter(model="m", request={"model": "m", "input": "hi"})
    decoder = SSEDecoder()
    events = [json.loads(e.data) for e in decoder.feed(emitter.close_error(answer.error)) + decoder.flush()]
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_openai_clients_and_non_streaming_responses_get_a_400_with_the_code(case: dict[str, Any]) -> None:
    for stream, in_stream in ((True, False), (False, True), (False, False)):
        answer = _answer(case, stream=stream, in_stream=in_stream)
        assert answer.kind is AnswerKind.HTTP_ERROR and answer.error is not None
        assert (answer.error.status, answer.error.code) == (400, "context_length_exceeded")
        assert not answer.retryable

