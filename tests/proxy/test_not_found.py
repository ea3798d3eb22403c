"""``proxy.edge.not_found``: the path a misconfigured client meant, and the protocol of its 404."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.edge.not_found import SERVED, message, nearest, speaks_anthropic


@pytest.mark.parametrize(("path", "meant"), [
    ("/v1/chat/completion", "/v1/chat/completions"),
    ("/chat/completions", "/v1/chat/completions"),
    ("/v1/v1/messages", "/v1/messages"),
    ("/v1/v1/v1/responses", "/v1/responses"),
    ("/messages", "/v1/messages"),
    ("/responses", "/v1/responses"),
    ("/models", "/v1/models"),
    ("/v1/message", "/v1/messages"),
    ("/v1/messages/count-tokens", "/v1/messages/count_tokens"),
    ("/v1/completions", "/v1/chat/completions"),
    ("/V1/Chat/Completions", "/v1/chat/completions"),
    ("/v1/embeddings", None),
    ("/v1/audio/speech", None),
    ("/v1/foo", None),
])
def test_it_names_the_path_meant(path: str, meant: str | None) -> None:
    assert nearest(path) == meant


def test_the_message_says_how_to_fix_the_base_url() -> None:
    assert message("POST", "/chat/completions", "/v1/chat/completions") == (
        "toolrelay serves no POST /chat/completions; did you mean POST /v1/chat/completions? (OpenAI clients take "
        "a base URL ending in /v1, e.g. https://relay.example.com/v1; Anthropic clients one without it)")
    assert "drop one" in message("POST", "/v1/v1/messages", "/v1/messages")
    assert message("GET", "/v1/chat/completion", "/v1/chat/completions").endswith("did you mean POST "
                                                                                   "/v1/chat/completions?")
    assert all(p in message("POST", "/v1/foo", None) for p in SERVED)


def _scope(**headers: str) -> dict[str, Any]:
    return {"headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}


def test_anthropic_callers_are_recognised() -> None:
    assert speaks_anthropic(_scope(anthropic_version="2023-06-01"), None)
    assert speaks_anthropic(_scope(x_api_key="tr-x"), "/v1/messages")
    assert not speaks_anthropic(_scope(x_api_key="tr-x"), "/v1/chat/completions")
    assert not speaks_anthropic(_scope(x_api_key="tr-x", authorization="Bearer tr-x"), "/v1/messages")
    assert not speaks_anthropic(_scope(authorization="Bearer tr-x"), "/v1/messages")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_it_never_raises_and_only_names_served_paths(path: str) -> None:
    meant = nearest(path)
    assert meant is None or meant in SERVED
    assert message("POST", path, meant)
