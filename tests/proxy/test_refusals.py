"""``proxy.upstreams.refusals``: the real error texts of each upstream family (``tests/corpus/refusals.json``, each
with its public source) become the fixes that change the sent body; anything else becomes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.upstreams.refusals import Fix, apply, classify, tool_choice_class

CASES = json.loads((Path(__file__).resolve().parents[1] / "corpus" / "refusals.json").read_text())
FAMILIES = {"deepseek", "vllm", "sglang", "llamacpp", "ollama", "dashscope", "moonshot", "zhipu", "groq", "openrouter"}


def _fixes(case: dict[str, Any]) -> list[list[Any]]:
    refused = classify(case["status"], json.dumps(case["body"], ensure_ascii=False).encode(), case["sent"])
    return [] if refused is None else [[f.parameter, f.limit, f.remember] for f in refused.fixes]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_it_reads_each_real_refusal(case: dict[str, Any]) -> None:
    """Each recorded text gives exactly the recorded fixes (none for the texts that must reach the client)."""
    assert _fixes(case) == case["fixes"]


def test_the_corpus_covers_every_family_the_issue_names() -> None:
    assert {c["family"] for c in CASES if c["fixes"]} >= FAMILIES


@pytest.mark.parametrize("case", [c for c in CASES if c["fixes"]], ids=lambda c: c["name"])
def test_the_family_and_the_upstreams_own_sentence_are_kept(case: dict[str, Any]) -> None:
    refused = classify(case["status"], json.dumps(case["body"], ensure_ascii=False).encode(), case["sent"])
    assert refused is not None and refused.family == case["family"]
    assert refused.message and refused.message != "Provider returned error", "the inner provider sentence"
    assert len(refused.message) <= 300


def test_it_reads_only_refusal_statuses() -> None:
    body = json.dumps({"error": {"message": "Invalid max_tokens value, the valid range of max_tokens is [1, 8192]"}})
    assert classify(400, body.encode(), {"max_tokens": 32000}) is not None
    for status in (200, 401, 403, 429, 502, 503):
        assert classify(status, body.encode(), {"max_tokens": 32000}) is None


def test_a_plain_text_body_is_read_too() -> None:
    refused = classify(400, b"Unsupported param: parallel_tool_calls", {"parallel_tool_calls": True})
    assert refused is not None and refused.fixes == (Fix("parallel_tool_calls"),)


def test_protected_fields_are_never_left_out() -> None:
    for field in ("messages", "model", "tools", "stream"):
        body = json.dumps({"error": {"message": f"Unrecognized request argument supplied: {field}"}}).encode()
        assert classify(400, body, {field: [1]}) is None


def test_apply_clamps_the_output_budget_whichever_field_carries_it() -> None:
    body = {"max_tokens": 32000, "max_completion_tokens": 9000, "temperature": 1}
    assert apply(body, [Fix("max_tokens", 8192)]) == {"max_tokens": 8192, "max_completion_tokens": 8192}
    assert apply({"max_tokens": 4000}, [Fix("max_tokens", 8192)]) == {}
    assert apply({"max_tokens": 4000}, [Fix("max_tokens")]) == {"max_tokens": None}


def test_apply_leaves_out_only_the_refused_class_of_tool_choice() -> None:
    fix = Fix("tool_choice=required")
    assert apply({"tool_choice": "required"}, [fix]) == {"tool_choice": None}
    assert apply({"tool_choice": "auto"}, [fix]) == {}
    assert apply({}, [fix]) == {}


def test_apply_ignores_booleans_and_non_numbers_for_clamps() -> None:
    assert apply({"max_tokens": True}, [Fix("max_tokens", 1)]) == {}
    assert apply({"max_tokens": "32000"}, [Fix("max_tokens", 1)]) == {}


def test_tool_choice_classes() -> None:
    assert [tool_choice_class(v) for v in (None, "auto", "none", "required", "any", {"type": "function"}, 3)] == [
        "", "auto", "none", "required", "other", "function", "other"]


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                 max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(status=st.sampled_from([400, 404, 422, 500]), body=st.binary(max_size=400), sent=st.dictionaries(
    st.sampled_from(["max_tokens", "tool_choice", "stream_options", "n", "messages", "x"]), _json, max_size=5))
def test_it_never_raises_on_any_bytes(status: int, body: bytes, sent: dict[str, Any]) -> None:
    refused = classify(status, body, sent)
    assert refused is None or all(apply(sent, (f,)) for f in refused.fixes)


@settings(max_examples=300, deadline=None)
@given(message=st.text(max_size=300), sent=st.dictionaries(st.sampled_from(["max_tokens", "tool_choice",
                                                                              "parallel_tool_calls"]), _json))
def test_every_fix_returned_changes_the_sent_body(message: str, sent: dict[str, Any]) -> None:
    refused = classify(400, json.dumps({"error": {"message": message}}).encode(), sent)
    assert refused is None or all(apply(sent, (f,)) for f in refused.fixes)
