"""Count broken tool calls with and without toolrelay in front of a corrupting upstream.

Sends streamed tool-call requests (openai-python, ``chat.completions.stream``) directly to the upstream
(by default the simulator `make run` started, which corrupts about one attempt in five) and the same
number through toolrelay, and counts the turns a strict agent could not execute: openai-python fails
on it, a tool call's name is not declared, its arguments are not a JSON object (text) that fits the
tool's schema, or there is no tool call at all (the answer toolrelay gives when retries run out
is counted as such, and named).

    .venv/bin/python scripts/tool_call_demo.py --key tr-... [--requests 100] [--json]

Where to send: ``--proxy`` / ``--upstream``, else ``SITE_URL``, ``PORT`` and ``SIMULATOR_PORT`` from
the environment, else from ``var/run.env`` (saved by `make run`), else ports 8000 and 8001. When
nothing listens at a URL the script says so and exits with status 2, instead of counting every turn
as broken.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PORT, DEFAULT_SIMULATOR_PORT = "8000", "8001"
EXHAUSTED_PREFIX = "[toolrelay]"
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"]}}},
    # A tool without parameters and one with an array parameter: the simulator's faults that need
    # such tools (empty arguments C19, double-encoded values C20) can then happen too.
    {"type": "function", "function": {"name": "get_time", "description": "The current time",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "set_todos", "description": "Replace the todo list", "parameters": {
        "type": "object", "properties": {"todos": {"type": "array", "items": {"type": "string"}}},
        "required": ["todos"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


class NotListening(Exception):
    """Nothing accepts connections at a base URL (or it refused the key): not a broken turn."""


@dataclass
class TurnResult:
    """One turn: its unique marker (in the user message), toolrelay's x-request-id, what was wrong."""

    marker: str
    request_id: str | None
    problem: str | None


@dataclass
class Tally:
    """The turns sent to one base URL."""

    label: str
    url: str
    turns: list[TurnResult] = field(default_factory=list)

    @property
    def reasons(self) -> Counter[str]:
        return Counter(t.problem for t in self.turns if t.problem is not None)

    @property
    def broken(self) -> int:
        return sum(self.reasons.values())

    def line(self) -> str:
        """``label  url  B / N broken turns  (n reason, ...)``: the reasons add up to B."""
        detail = ", ".join(f"{n} {why}" for why, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        counts = f"{self.broken:>4} / {len(self.turns)} broken turns"
        return f"{self.label:<18} {self.url:<28} {counts}{'  (' + detail + ')' if detail else ''}"

    def summary(self) -> dict[str, Any]:
        return {"url": self.url, "requests": len(self.turns), "broken": self.broken, "reasons": dict(self.reasons),
                "turns": [asdict(t) for t in self.turns]}


# ----- where to send -----

def run_settings(environ: Mapping[str, str], path: Path) -> dict[str, str]:
    """``SITE_URL``, ``PORT``, ``SIMULATOR_PORT``, ``UPSTREAM_URL``: the environment first, then ``path``
    (var/run.env, written by `make run`)."""
    saved: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not name.lstrip().startswith("#"):
                saved[name.strip()] = value.strip()
    values: dict[str, str] = {}
    for name in ("SITE_URL", "PORT", "SIMULATOR_PORT", "UPSTREAM_URL"):
        value = environ.get(name) or saved.get(name, "")
        if value:
            values[name] = value
    return values


def default_urls(values: Mapping[str, str]) -> tuple[str, str]:
    """(toolrelay base URL, upstream base URL) from the run settings: the demo's real upstream
    (``UPSTREAM_URL``) when `make run` used one, else the simulator."""
    port = values.get("PORT", DEFAULT_PORT)
    site = values.get("SITE_URL") or f"http://127.0.0.1:{port}"
    simulator = f"http://127.0.0.1:{values.get('SIMULATOR_PORT', DEFAULT_SIMULATOR_PORT)}/v1"
    upstream = values.get("UPSTREAM_URL") or simulator
    return f"{site.rstrip('/')}/v1", upstream.rstrip("/")


def run_env_path(environ: Mapping[str, str]) -> Path:
    """``$TOOLRELAY_VAR_DIR/run.env``, else the checkout's ``var/run.env``."""
    return Path(environ.get("TOOLRELAY_VAR_DIR") or ROOT / "var") / "run.env"


def probe(base_url: str, key: str, *, proxy: bool) -> None:
    """Raise NotListening when nothing accepts connections at ``base_url`` (or toolrelay refuses ``key``)."""
    try:
        answer = httpx.get(f"{base_url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    except httpx.TransportError as exc:
        hint = " (is `make run` running? It saves its ports in var/run.env)"
        raise NotListening(f"nothing is listening at {base_url}: {type(exc).__name__}{hint}") from exc
    if proxy and answer.status_code == 401:
        raise NotListening(f"toolrelay at {base_url} refused the key (HTTP 401): pass a key of this server's "
                           "database with --key (`python manage.py apikey create --tenant demo` makes one)")


# ----- what counts as broken -----

def call_problem(call: Any) -> str | None:
    """Why one tool call cannot be run, or None. Never raises: the shapes are whatever the SDK built
    from the upstream (``arguments`` may be an object, ``function`` missing, ...)."""
    function = getattr(call, "function", None)
    name = getattr(function, "name", None)
    if name not in SCHEMAS:
        return "undeclared tool name"
    arguments = getattr(function, "arguments", None)
    if not isinstance(arguments, str):
        return "invalid arguments (not a JSON string)"
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return "invalid arguments (not JSON)"
    if not isinstance(parsed, dict):
        return "invalid arguments (not an object)"
    try:
        jsonschema.validate(parsed, SCHEMAS[name])
    except jsonschema.ValidationError:
        return "invalid arguments (schema)"
    return None


def message_problem(message: Any) -> str | None:
    """Why an assistant message is unusable for a strict agent, or None when every tool call is valid."""
    calls = getattr(message, "tool_calls", None) or []
    if not calls:
        text = getattr(message, "content", None)
        # After text streamed from an earlier attempt, the exhaustion answer follows that text.
        if isinstance(text, str) and (text.startswith(EXHAUSTED_PREFIX) or f"\n\n{EXHAUSTED_PREFIX}" in text):
            return "toolrelay gave up (retries exhausted)"
        return "no tool call"
    return next((why for why in map(call_problem, calls) if why is not None), None)


def problem(client: openai.OpenAI, model: str, marker: str) -> str | None:
    """Send one turn; why it is unusable, or None. Raises openai.APIConnectionError when the server
    could not be reached or the connection broke (the caller tells the two apart)."""
    messages = [{"role": "user", "content": f"Check the weather in Paris and save it. [{marker}]"}]
    try:
        # Wrong shapes from the upstream make pydantic warn while the SDK copies them; they are
        # judged below, not printed.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with client.chat.completions.stream(model=model, messages=messages, tools=TOOLS) as stream:  # type: ignore[arg-type]
                for _ in stream:
                    pass
                completion = stream.get_final_completion()
        message = completion.choices[0].message
    except openai.APIConnectionError:
        raise
    except openai.APIError as exc:
        # toolrelay's terminal error (exhaustion policy ``fail``, the default): the turn was refused, not broken.
        if EXHAUSTED_PREFIX in str(exc.message):
            return "toolrelay gave up (retries exhausted)"
        return f"client error: {type(exc).__name__}"
    except Exception as exc:  # noqa: BLE001 - any SDK failure is a broken turn for the agent
        return f"client error: {type(exc).__name__}"
    return message_problem(message)


def run(label: str, base_url: str, key: str, model: str, requests: int, *, proxy: bool) -> Tally:
    """Send ``requests`` turns to ``base_url`` and record each one's verdict and x-request-id."""
    probe(base_url, key, proxy=proxy)
    seen: list[str | None] = []

    def remember(response: Any) -> None:
        seen.append(response.headers.get("x-request-id"))

    tally = Tally(label, base_url)
    http = openai.DefaultHttpxClient(event_hooks={"response": [remember]})
    with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60, http_client=http) as client:
        for _ in range(requests):
            marker, seen[:] = uuid.uuid4().hex, []
            try:
                why = problem(client, model, marker)
            except openai.APIConnectionError as exc:
                probe(base_url, key, proxy=proxy)  # raises NotListening when the server is gone
                why = f"client error: {type(exc).__name__}"
            tally.turns.append(TurnResult(marker, seen[-1] if seen and proxy else None, why))
    return tally


def main(argv: list[str] | None = None) -> int:
    """Run both paths and print one line each (or one JSON object); 2 when nothing is listening."""
    proxy_url, upstream_url = default_urls(run_settings(os.environ, run_env_path(os.environ)))
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--key", required=True, help="a toolrelay API key (printed by make run)")
    parser.add_argument("--proxy", default=proxy_url, help=f"toolrelay's base URL (default {proxy_url})")
    parser.add_argument("--upstream", default=upstream_url, help=f"the upstream, called directly ({upstream_url})")
    parser.add_argument("--upstream-key", default=os.environ.get("UPSTREAM_API_KEY") or "sk-direct",
                        help="the upstream's own key for the direct calls (default $UPSTREAM_API_KEY)")
    parser.add_argument("--model", default="deepseek-chat")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print one JSON object with every turn's verdict")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    try:
        direct = run("direct upstream", args.upstream.rstrip("/"), args.upstream_key, args.model, args.requests,
                     proxy=False)
        relayed = run("through toolrelay", args.proxy.rstrip("/"), args.key, args.model, args.requests, proxy=True)
    except NotListening as exc:
        print(f"tool_call_demo: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"direct": direct.summary(), "proxy": relayed.summary()}))
    else:
        print(direct.line())
        print(relayed.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
