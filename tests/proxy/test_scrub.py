"""The one scrubber (issue 15, item 3): the review's leaks, redacted in every encoding."""

from __future__ import annotations

import base64
import json
import re
import socket
from urllib.parse import quote, quote_plus

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from infra.scrub import REDACTED, redact, redact_bytes

SECRET = "sk-A/B+c9=Zz_secret"
HEADER = "hdr-org-value-5c2e"
SECRETS = frozenset({SECRET, HEADER})


def _escaped_everywhere(secret: str) -> list[str]:
    return [
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret)[1:-1].replace("/", "\\/"),                 # the review's `sk-A\/B`
        "".join(f"\\u{ord(c):04x}" for c in secret),
        "".join(f"\\u{ord(c):04X}" if i % 2 else c for i, c in enumerate(secret)),  # a mixture
        quote(secret, safe=""), re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(secret, safe="")),
        quote_plus(secret), quote(secret),
        base64.b64encode(secret.encode()).decode(), base64.urlsafe_b64encode(secret.encode()).decode().rstrip("="),
    ]


@pytest.mark.parametrize("spelling", _escaped_everywhere(SECRET))
def test_a_secret_is_redacted_in_every_encoding(spelling: str) -> None:
    text = f'{{"error": {{"message": "invalid key {spelling} for org"}}}}'
    out = redact(text, SECRETS)
    assert spelling not in out and REDACTED in out and "for org" in out


def test_the_reviews_illegal_header_value_error_is_redacted() -> None:
    """httpx refuses a header value with a line break when sending and quotes it: redacted."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/chat/completions"
        with httpx.Client() as client, pytest.raises(httpx.LocalProtocolError) as raised:
            client.post(url, headers={"x-org": f"{HEADER}\n"}, content=b"{}")
    message = str(raised.value)
    assert HEADER in message  # the leak the review saw
    assert HEADER not in redact(message, SECRETS)
    assert HEADER not in redact(repr(raised.value), frozenset({f"{HEADER}\n"}))  # an old row's unstripped value


def test_a_reflected_credential_in_a_body_and_auth_tokens_are_redacted() -> None:
    body = json.dumps({"choices": [{"delta": {"content": f"your key is {SECRET}, header Bearer {SECRET}"}}]})
    out = redact_bytes(body.encode(), SECRETS).decode()
    assert SECRET not in out and json.loads(out)  # still JSON
    basic = "Basic " + base64.b64encode(b"alice:wonderland-42").decode()
    assert redact(f"sent {basic} upstream", frozenset()) == f"sent Basic {REDACTED} upstream"
    assert redact("Authorization: Bearer sk-live-0123456789", frozenset()) == f"Authorization: Bearer {REDACTED}"
    assert "wonderland-42" not in redact("pw wonderland-42", frozenset({basic}))  # user:pass inside a Basic value


def test_prose_and_short_values_are_left_alone() -> None:
    text = "A basic idea: bearer tokens are described in RFC 6750. Basic auth is old."
    assert redact(text, frozenset({"abc"})) == text


@given(secret=st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=8, max_size=40),
       before=st.text(max_size=20), after=st.text(max_size=20))
@example(secret="00\\00000", before="", after="")  # a raw backslash before \u0030 fooled the cheap pre-check
def test_no_encoding_of_any_secret_survives(secret: str, before: str, after: str) -> None:
    for spelling in _escaped_everywhere(secret):
        out = redact(f"{before}{spelling}{after}", frozenset({secret}))
        assert spelling not in out
