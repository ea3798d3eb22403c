"""``refuse=NAME[/ARG][,NAME[/ARG]...]``: the simulator refuses a request parameter as a real upstream does.

Each name is ``<family>-<what>``: the family's own wording, status and error envelope, verbatim (the
sources are those of ``proxy/upstreams/refusals.py``; this module shares no code with it, so the proxy's reading
is tested against an independent writer). A request that does not carry the parameter (or carries an
acceptable value) is answered normally, so a proxy that learned the fix gets a clean answer.

    deepseek-max-tokens/N      max_tokens (or max_completion_tokens) > N: DeepSeek's "valid range" 400
    dashscope-max-tokens/N     Qwen / DashScope "Range of max_tokens should be [1, N]"
    groq-max-tokens/N          Groq "max_tokens must be less than or equal to N"
    zhipu-max-tokens/N         Zhipu code 1214 "max_tokens参数非法" (no range named)
    openrouter-max-tokens/N    OpenRouter wrapping DeepSeek's 400 in error.metadata.raw
    opaque-max-tokens/N        a refusal naming nothing ("Bad request"): what no proxy can learn from
    vllm-context/N             vLLM: max_tokens + prompt (messages and tools, ~4 characters a token) > N
    sglang-context/N           SGLang's wording of the same
    moonshot-context/N         Moonshot "exceeded model token limit: N (requested: T)"
    openai-stream-options      "Unrecognized request argument supplied: stream_options"
    vllm-stream-options        a strict server's pydantic extra_forbidden for stream_options
    openai-parallel-tool-calls "Unsupported parameter: 'parallel_tool_calls' is not supported with this model."
    vllm-tool-choice[/CLASS]   'tool_choice = "required" is not supported!' (CLASS default required)
    deepseek-tool-choice[/CLASS] "deepseek-reasoner does not support this tool_choice" (default: any but auto)
    moonshot-tool-choice[/CLASS] "tool_choice 'required' is incompatible with thinking enabled"
    llamacpp-tool-choice       llama.cpp without --jinja: "Unsupported param: tool_choice" (any value)
    openrouter-tool-choice[/CLASS] 404 "No endpoints found that support the provided 'tool_choice' value"
    ollama-thinking            '"<model>" does not support thinking' when reasoning_effort / reasoning is sent
    moonshot-temperature       "invalid temperature: only 1 is allowed for this model" for any other value
    vllm-field/NAME            pydantic extra_forbidden for field NAME
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

JSON = "application/json"

Check = Callable[[dict[str, Any], str], bool]
Answer = Callable[[dict[str, Any], str], tuple[int, dict[str, Any]]]


@dataclass(frozen=True)
class Refusal:
    """A refusal the simulator sends: ``status`` and the JSON ``body``."""

    name: str
    status: int
    body: dict[str, Any]

    def encoded(self) -> bytes:
        return json.dumps(self.body, ensure_ascii=False).encode()


def _budget(body: dict[str, Any]) -> int:
    values = [v for k in ("max_tokens", "max_completion_tokens") if isinstance(v := body.get(k), int)]
    return max(values) if values else 0


def _prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt at about 4 characters a token: the messages and the declared tools (a chat template
    renders the tools into the prompt, so a server's window counts them; Claude Code's compaction
    request, which declares none, is smaller than the request that overflowed)."""
    return max(1, len(json.dumps([body.get("messages"), body.get("tools") or []], ensure_ascii=False)) // 4)


def _choice(body: dict[str, Any]) -> str:
    value = body.get("tool_choice")
    if isinstance(value, dict):
        return "function"
    return value if isinstance(value, str) else ""


def _openai(message: str, *, type_: str = "invalid_request_error", param: Any = None, code: Any = None
            ) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _vllm(message: str, type_: str = "BadRequestError") -> dict[str, Any]:
    return {"object": "error", "message": message, "type": type_, "param": None, "code": 400}


def _deepseek_budget(limit: int) -> dict[str, Any]:
    return _openai(f"Invalid max_tokens value, the valid range of max_tokens is [1, {limit}]",
                   code="invalid_request_error")


def _extra(field: str) -> dict[str, Any]:
    return _vllm(f"[{{'type': 'extra_forbidden', 'loc': ('body', '{field}'), 'msg': 'Extra inputs are not "
                 f"permitted', 'input': None}}]")


def _over_budget(body: dict[str, Any], arg: str) -> bool:
    return _budget(body) > int(arg)


def _over_window(body: dict[str, Any], arg: str) -> bool:
    return _budget(body) + _prompt_tokens(body) > int(arg)


def _has(field: str) -> Check:
    return lambda body, arg: field in body


def _chosen(default: str) -> Check:
    """``tool_choice`` of class ``arg`` (or ``default``; ``any`` = every value but auto) was sent."""
    def check(body: dict[str, Any], arg: str) -> bool:
        wanted, sent = arg or default, _choice(body)
        return bool(sent) and (sent == wanted or (wanted == "any" and sent != "auto"))
    return check


_KINDS: dict[str, tuple[Check, Answer]] = {
    "deepseek-max-tokens": (_over_budget, lambda b, a: (400, _deepseek_budget(int(a)))),
    "dashscope-max-tokens": (_over_budget, lambda b, a: (400, {
        "error": {"code": "invalid_parameter_error", "param": None, "type": "invalid_request_error",
                  "message": f"<400> InternalError.Algo.InvalidParameter: Range of max_tokens should be [1, {a}]"},
        "id": "chatcmpl-sim", "request_id": "sim"})),
    "groq-max-tokens": (_over_budget, lambda b, a: (400, _openai(
        f"max_tokens must be less than or equal to {a}, the maximum value for max_tokens is less than the "
        "context_window for this model"))),
    "zhipu-max-tokens": (_over_budget, lambda b, a: (400, {"error": {"code": "1214",
                                                                     "message": "max_tokens参数非法。请检查文档。"}})),
    "openrouter-max-tokens": (_over_budget, lambda b, a: (400, {"error": {
        "message": "Provider returned error", "code": 400,
        "metadata": {"raw": json.dumps(_deepseek_budget(int(a))), "provider_name": "DeepSeek"}}})),
    "opaque-max-tokens": (_over_budget, lambda b, a: (400, _openai("Bad request"))),
    "vllm-context": (_over_window, lambda b, a: (400, _vllm(
        f"This model's maximum context length is {a} tokens. However, you requested {_budget(b) + _prompt_tokens(b)} "
        f"tokens ({_prompt_tokens(b)} in the messages, {_budget(b)} in the completion). Please reduce the length "
        "of the messages or completion."))),
    "sglang-context": (_over_window, lambda b, a: (400, _vllm(
        f"Requested token count exceeds the model's maximum context length of {a} tokens. You requested a total of "
        f"{_budget(b) + _prompt_tokens(b)} tokens: {_prompt_tokens(b)} tokens from the input messages and "
        f"{_budget(b)} tokens for the completion. Please reduce the number of tokens in the input messages or the "
        "completion to fit within the limit.", "BadRequest"))),
    "moonshot-context": (_over_window, lambda b, a: (400, {"error": {
        "message": f"Invalid request: Your request exceeded model token limit: {a} (requested: "
                   f"{_budget(b) + _prompt_tokens(b)})", "type": "invalid_request_error"}})),
    "openai-stream-options": (_has("stream_options"), lambda b, a: (400, _openai(
        "Unrecognized request argument supplied: stream_options"))),
    "vllm-stream-options": (_has("stream_options"), lambda b, a: (400, _extra("stream_options"))),
    "openai-parallel-tool-calls": (_has("parallel_tool_calls"), lambda b, a: (400, _openai(
        "Unsupported parameter: 'parallel_tool_calls' is not supported with this model.",
        param="parallel_tool_calls", code="unsupported_parameter"))),
    "vllm-tool-choice": (_chosen("required"), lambda b, a: (400, _vllm(
        f'tool_choice = "{a or "required"}" is not supported!'))),
    "deepseek-tool-choice": (_chosen("any"), lambda b, a: (400, _openai(
        "deepseek-reasoner does not support this tool_choice", code="invalid_request_error"))),
    "moonshot-tool-choice": (_chosen("required"), lambda b, a: (400, {"error": {
        "message": f"tool_choice '{'specified' if _choice(b) == 'function' else _choice(b)}' is incompatible with "
                   "thinking enabled", "type": "invalid_request_error"}})),
    "llamacpp-tool-choice": (_has("tool_choice"), lambda b, a: (500, {"error": {
        "code": 500, "message": "Unsupported param: tool_choice", "type": "server_error"}})),
    "openrouter-tool-choice": (_chosen("required"), lambda b, a: (404, {"error": {
        "message": "No endpoints found that support the provided 'tool_choice' value. To learn more about provider "
                   "routing, visit: https://openrouter.ai/docs/provider-routing", "code": 404}})),
    "ollama-thinking": (lambda b, a: "reasoning_effort" in b or "reasoning" in b, lambda b, a: (400, {"error": {
        "message": f"\"{b.get('model')}\" does not support thinking", "type": "invalid_request_error", "param": None,
        "code": None}})),
    "moonshot-temperature": (lambda b, a: "temperature" in b and b["temperature"] != 1, lambda b, a: (400, {
        "error": {"message": "invalid temperature: only 1 is allowed for this model",
                  "type": "invalid_request_error"}})),
    "vllm-field": (lambda b, a: bool(a) and a in b, lambda b, a: (400, _extra(a))),
}
_NEEDS_NUMBER = frozenset(k for k in _KINDS if k.endswith(("-max-tokens", "-context")))


def names() -> list[str]:
    """Every refusal name ``refuse=`` accepts."""
    return sorted(_KINDS)


def parse(value: str) -> list[tuple[str, str]]:
    """``refuse=`` items as (name, argument); ``ValueError`` naming the known names for a bad one."""
    items = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, _, arg = item.partition("/")
        if name not in _KINDS:
            raise ValueError(f"unknown refusal {name!r} (known: {', '.join(names())})")
        if name in _NEEDS_NUMBER and not arg.isdigit():
            raise ValueError(f"refusal {name} needs a token count, e.g. {name}/8192")
        items.append((name, arg))
    return items


def refusal(value: str, body: dict[str, Any]) -> Refusal | None:
    """The first refusal of ``refuse=value`` that applies to ``body``, else None."""
    for name, arg in parse(value):
        check, answer = _KINDS[name]
        if check(body, arg):
            status, error = answer(body, arg)
            return Refusal(name, status, error)
    return None
