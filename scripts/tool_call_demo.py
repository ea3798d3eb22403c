"""Count broken tool calls with and without toolrelay in front of a corrupting upstream.

Sends the same streamed tool-call requests (openai-python, ``chat.completions.stream``) once directly
to the upstream (by default the demo simulator on :8001, which corrupts about one attempt in five)
and once through toolrelay, and counts the turns a strict agent could not execute: an SDK error, a
tool call whose name is not declared, arguments that are not a JSON object or do not fit the
tool's schema, or no tool call at all.

    .venv/bin/python scripts/tool_call_demo.py --key tr-... [--requests 100]
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections import Counter
from typing import Any

import jsonschema
import openai

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def problem(client: openai.OpenAI, model: str) -> str | None:
    """Why this turn is unusable for a strict agent, or None when every tool call is valid."""
    messages = [{"role": "user", "content": f"Check the weather in Paris and save it. [{uuid.uuid4().hex}]"}]
    try:
        with client.chat.completions.stream(model=model, messages=messages, tools=TOOLS) as stream:
            for _ in stream:
                pass
            message = stream.get_final_completion().choices[0].message
    except Exception as exc:  # any SDK failure is a broken turn for the agent
        return f"client error: {type(exc).__name__}"
    if not message.tool_calls:
        return "no tool call"
    for call in message.tool_calls:
        if call.function.name not in SCHEMAS:
            return "undeclared tool name"
        try:
            arguments = json.loads(call.function.arguments)
            jsonschema.validate(arguments, SCHEMAS[call.function.name])
        except (ValueError, jsonschema.ValidationError):
            return "invalid arguments"
    return None


def run(label: str, base_url: str, key: str, model: str, requests: int) -> None:
    """Send ``requests`` turns and print how many were broken, by reason."""
    with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60) as client:
        reasons = Counter(problem(client, model) for _ in range(requests))
    broken = requests - reasons.pop(None, 0)
    detail = ", ".join(f"{n} {why}" for why, n in reasons.most_common())
    print(f"{label:<16} {broken:>4} / {requests} broken turns{'  (' + detail + ')' if detail else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key", required=True, help="a toolrelay API key (printed by make run)")
    parser.add_argument("--proxy", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--upstream", default="http://127.0.0.1:8001/v1", help="the upstream, called directly")
    parser.add_argument("--model", default="deepseek-chat")
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    run("direct upstream", args.upstream, "sk-direct", args.model, args.requests)
    run("through toolrelay", args.proxy, args.key, args.model, args.requests)


if __name__ == "__main__":
    main()
