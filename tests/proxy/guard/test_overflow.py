"""Context-window refusals of every upstream family, read and said as Claude Code and Codex parse them."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.decisions.answer import AnswerKind, answer_for
from proxy.guard.policy import GuardPolicy
from proxy.guard.stream.overflow import ContextOverflow, anthropic_wording, read_overflow
from proxy.guard.turn import Decision, Outcome, UpstreamError

#: Claude Code's two readings (anthropics/claude-code#228, #476): the output budget, then compaction.
BUDGET_RE = re.compile(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)")
TOO_LONG_RE = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum")

WORDINGS = [
    ("This model's maximum context length is 65536 tokens. However, you requested 70000 tokens (60000 in the "
     "messages, 10000 in the completion). Please reduce the length of the messages or completion.",
     ContextOverflow(65536, 60000, 10000)),
    ("This model's maximum context length is 32768 tokens. However, you requested 4096 output tokens and your "
     "prompt contains at least 30000 input tokens, for a total of at least 34096 tokens.",
     ContextOverflow(32768, 30000, 4096)),
    ("'max_tokens' or 'max_completion_tokens' is too large: 8192. This model's maximum context length is 32768 "
     "tokens and your request has 30000 input tokens (8192 > 32768 - 30000).", ContextOverflow(32768, 30000, 8192)),
    ("This model's maximum context length is 8192 tokens. However, your messages resulted in 9001 tokens. "
     "Please reduce the length of the messages.", ContextOverflow(8192, 9001, None, input_only=True)),
    ("Requested token count exceeds the model's maximum context length of 131072 tokens. You requested a total of "
     "140000 tokens: 136000 tokens from the input messages and 4000 tokens for the completion.",
     ContextOverflow(131072, 136000, 4000)),
    ("The input (345516 tokens) is longer than the model's context length (262144 tokens). (request_id=req_1)",
     ContextOverflow(262144, 345516, None, input_only=True)),
    ("request (4213 tokens) exceeds the available context size (4096 tokens), try increasing it",
     ContextOverflow(4096, 4213, None, input_only=True)),
    ("the request exceeds the available context size, try increasing it", ContextOverflow(input_only=True)),
    ("Invalid request: Your request exceeded model token limit: 262144 (requested: 269030)",
     ContextOverflow(262144, None, None, total=269030)),
    ("<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 129024]",
     ContextOverflow(129024, None, None, input_only=True)),
    ("Prompt exceeds max length", ContextOverflow(input_only=True)),
    ("Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
     ContextOverflow(32768, 40000, None)),
    ("Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens "
     "and 500 `max_new_tokens`", ContextOverflow(4096, 4000, 500)),
    ("prompt is too long: 230000 tokens > 200000 maximum", ContextOverflow(200000, 230000, None, input_only=True)),
]


@pytest.mark.parametrize("message, expected", WORDINGS)
def test_each_familys_wording_is_read(message: str, expected: ContextOverflow) -> None:
    assert read_overflow(message) == expected


@pytest.mark.parametrize("message", ["Invalid max_tokens value, the valid range of max_tokens is [1, 8192]",
                                     "Rate limit reached", "", "tool_choice = \"required\" is not supported!"])
def test_other_errors_are_no_overflow(message: str) -> None:
    assert read_overflow(message) is None


def test_the_wording_is_the_one_claude_code_parses() -> None:
    fits = anthropic_wording(ContextOverflow(32768, 30000, 4096), prompt_estimate=1, budget=None)
    assert BUDGET_RE.search(fits) and BUDGET_RE.search(fits).groups() == ("30000", "4096", "32768")  # type: ignore
    over = anthropic_wording(ContextOverflow(262144, 345516), prompt_estimate=1, budget=None)
    assert TOO_LONG_RE.match(over) and TOO_LONG_RE.match(over).groups() == ("345516", "262144")  # type: ignore
    unknown = anthropic_wording(ContextOverflow(), prompt_estimate=5000, budget=32000)
    assert TOO_LONG_RE.match(unknown), "no figures from the upstream: toolrelay's count of the prompt"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_read_without_raising_and_figures_stay_positive(text: str) -> None:
    found = read_overflow(text)
    if found is not None:
        assert all(v is None or v > 0 for v in (found.limit, found.prompt, found.output))
        said = anthropic_wording(found, prompt_estimate=10, budget=None)
        assert BUDGET_RE.search(said) or TOO_LONG_RE.match(said)


def test_an_upstream_overflow_reaches_the_client_as_invalid_request_with_the_code() -> None:
    error = UpstreamError(400, "the request exceeds the available context size, try increasing it",
                          "invalid_request_error", retryable=False)
    answer = answer_for(Decision(Outcome.RETRY, None, error=error), committed=False, stream=True, checked=True,
                        policy=GuardPolicy(), attempts=1, request_id="r", prompt_tokens=9000, budget=4096)
    assert answer.kind is AnswerKind.HTTP_ERROR and answer.error is not None
    assert (answer.error.status, answer.error.type, answer.error.code) == (400, "invalid_request_error",
                                                                          "context_length_exceeded")
    assert TOO_LONG_RE.match(answer.error.message) and "9000 tokens" in answer.error.message
