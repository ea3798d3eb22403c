"""Usage read right from every upstream family's shape, and bounded (issue 19 item 1, issue 24 item 4)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.guard.checks.usage import MAX_TOKENS, Usage, read_usage


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        # OpenAI: cached and reasoning details
        (
            {
                "prompt_tokens": 100,
                "completion_tokens": 50,
                "prompt_tokens_details": {"cached_tokens": 80},
                "completion_tokens_details": {"reasoning_tokens": 20},
            },
            (100, 50, 80, 0, 20),
        ),
        # DeepSeek: hit + miss
        (
            {"prompt_tokens": 30, "completion_tokens": 5, "prompt_cache_hit_tokens": 24, "prompt_cache_miss_tokens": 6},
            (30, 5, 24, 0, 0),
        ),
        ({"prompt_cache_hit_tokens": 24, "prompt_cache_miss_tokens": 6, "completion_tokens": 5}, (30, 5, 24, 0, 0)),
        # Kimi: top-level cached_tokens
        ({"prompt_tokens": 40, "completion_tokens": 4, "cached_tokens": 32}, (40, 4, 32, 0, 0)),
        # GLM / vLLM / SGLang / MiniMax: OpenAI's details
        (
            {
                "prompt_tokens": 12,
                "completion_tokens": 3,
                "total_tokens": 15,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
            (12, 3, 0, 0, 0),
        ),
        # Qwen / DashScope explicit cache: a cache write
        (
            {
                "prompt_tokens": 1000,
                "completion_tokens": 10,
                "prompt_tokens_details": {
                    "cached_tokens": 0,
                    "cache_creation_input_tokens": 900,
                    "cache_type": "ephemeral",
                },
            },
            (1000, 10, 0, 900, 0),
        ),
        (
            {
                "prompt_tokens": 1000,
                "completion_tokens": 10,
                "prompt_tokens_details": {"cache_creation": {"ephemeral_5m_input_tokens": 700}},
            },
            (1000, 10, 0, 700, 0),
        ),
        # Anthropic-shaped usage relayed by a gateway: input excludes the cache
        (
            {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 5},
            (105, 7, 90, 5, 0),
        ),
        # MiniMax reasoning
        (
            {
                "prompt_tokens": 9,
                "completion_tokens": 30,
                "completion_tokens_details": {"reasoning_tokens": 25},
                "total_characters": 0,
            },
            (9, 30, 0, 0, 25),
        ),
    ],
)
def test_every_family_shape(obj: dict[str, Any], expected: tuple[int, ...]) -> None:
    usage = read_usage(obj)
    assert (usage.prompt, usage.completion, usage.cache_read, usage.cache_write, usage.reasoning) == expected
    assert usage.anomalies == ()
    assert usage.known


@pytest.mark.parametrize("bad", [10**20, -5, "12", True, 1.5, float("nan"), [1], {"a": 1}])
def test_nonsense_is_an_anomaly_and_unknown(bad: Any) -> None:
    usage = read_usage({"prompt_tokens": bad, "completion_tokens": 7})
    assert usage.prompt is None and usage.completion == 7
    assert len(usage.anomalies) == 1 and "prompt_tokens" in usage.anomalies[0]
    estimated = usage.with_estimate(11, 99)
    assert (estimated.prompt, estimated.completion, estimated.estimated) == (11, 7, True)


def test_parts_larger_than_their_whole_are_clamped() -> None:
    usage = read_usage(
        {
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 50},
            "completion_tokens_details": {"reasoning_tokens": 9},
        }
    )
    assert (usage.cache_read, usage.reasoning) == (10, 2)
    assert len(usage.anomalies) == 2


def test_absent_usage_is_estimated_not_zero() -> None:
    assert read_usage(None) == Usage()
    usage = read_usage(None).with_estimate(25, 3)
    assert (usage.prompt, usage.completion, usage.estimated) == (25, 3, True)
    assert read_usage({"prompt_tokens": 1, "completion_tokens": 1}).with_estimate(5, 5).estimated is False


def test_client_shapes() -> None:
    usage = read_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 50,
            "prompt_tokens_details": {"cached_tokens": 60, "cache_creation_input_tokens": 30},
            "completion_tokens_details": {"reasoning_tokens": 5},
        }
    )
    assert usage.anthropic() == {
        "input_tokens": 10,
        "output_tokens": 50,
        "cache_creation_input_tokens": 30,
        "cache_read_input_tokens": 60,
    }
    responses = usage.responses()
    assert responses["input_tokens"] == 100 and responses["input_tokens_details"] == {
        "cached_tokens": 60,
        "cache_write_tokens": 30,
    }
    assert responses["output_tokens_details"] == {"reasoning_tokens": 5} and responses["total_tokens"] == 150


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True)
    | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)
_NAMES = st.sampled_from(
    [
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "prompt_cache_hit_tokens",
        "prompt_cache_miss_tokens",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "reasoning_tokens",
        "total_tokens",
    ]
)
_DETAILS = st.dictionaries(
    st.sampled_from(
        ["cached_tokens", "cache_creation_input_tokens", "cache_write_tokens", "reasoning_tokens", "cache_creation"]
    ),
    _JSON,
    max_size=4,
)
_USAGE = st.dictionaries(_NAMES, _JSON, max_size=8).flatmap(
    lambda base: st.fixed_dictionaries(
        {}, optional={"prompt_tokens_details": _DETAILS, "completion_tokens_details": _DETAILS}
    ).map(lambda extra: {**base, **extra})
)


@settings(max_examples=400, deadline=None)
@given(
    obj=_USAGE | _JSON,
    prompt=st.integers(min_value=-(10**25), max_value=10**25),
    completion=st.integers(min_value=-(10**25), max_value=10**25),
)
def test_usage_never_negative_or_oversized(obj: Any, prompt: int, completion: int) -> None:
    """Whatever an upstream sends (and whatever the estimate), every count is 0..MAX_TOKENS and the parts fit."""
    for usage in (read_usage(obj), read_usage(obj).with_estimate(prompt, completion)):
        for value in (usage.prompt, usage.completion, usage.cache_read, usage.cache_write, usage.reasoning):
            assert value is None or (type(value) is int and 0 <= value <= MAX_TOKENS)
        assert usage.cache_read + usage.cache_write <= (usage.prompt or 0) or usage.prompt is None
        assert usage.reasoning <= (usage.completion or 0) or usage.completion is None
        assert 0 <= usage.fresh_input <= MAX_TOKENS and 0 <= usage.plain_output <= MAX_TOKENS
