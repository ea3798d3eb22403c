"""The Python snippets of docs/clients.md, run as written against the running proxy (Daphne + simulator).

Every ```` ```python tested ```` block of the page is executed with its base URL pointed at the test
server and ``TOOLRELAY_KEY`` set to a fresh tenant's key; what it built is then checked. A snippet
that breaks, or a page that loses its tested snippets, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
BLOCKS = re.findall(r"```python tested\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
#: The base URL the page uses (the one ``make run`` serves).
DOC_URL = "http://127.0.0.1:8000"


def test_the_page_keeps_its_tested_snippets() -> None:
    sources = "\n".join(BLOCKS)
    assert len(BLOCKS) >= 3
    assert "chat.completions" in sources and "responses." in sources and "anthropic.Anthropic" in sources


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_the_snippet_runs_against_the_proxy(index: int, make_tenant: Any, proxy_server: Any,
                                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    tenant = make_tenant()
    monkeypatch.setenv("TOOLRELAY_KEY", tenant.api_key)
    code = BLOCKS[index].replace(DOC_URL, proxy_server.url)
    namespace: dict[str, Any] = {"__name__": f"clients_doc_{index}"}
    exec(compile(code, f"{DOC.name} python block {index}", "exec"), namespace)  # noqa: S102 - the page's own code
    assert capsys.readouterr().out.strip(), "the snippet prints its result"
    if "completion" in namespace:
        calls = namespace["completion"].choices[0].message.tool_calls
        assert calls and all(c.function.name == "get_weather" for c in calls)
    if "response" in namespace:
        assert namespace["response"].status == "completed" and namespace["response"].output_text
    if "message" in namespace:
        message = namespace["message"]
        assert message.stop_reason == "tool_use" and [b for b in message.content if b.type == "tool_use"]
