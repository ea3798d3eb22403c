"""An upstream's context-window refusal, read from any family's wording and said as the clients parse it.

Pure: strings in, a ``ContextOverflow`` or a message out; never raises (issue 23, item 3).

Agents heal themselves from a context overflow only when it reaches them in the words they parse:
Claude Code lowers its output budget on Anthropic's ``input length and `max_tokens` exceed context
limit: P + B > L, decrease input length or `max_tokens` and try again`` and compacts on ``prompt is too
long: P tokens > L maximum`` (both ``invalid_request_error``, HTTP 400; anthropics/claude-code#228,
#476, #16580; a gateway that rewraps the upstream's wording makes the same request fail three times,
musistudio/claude-code-router#1799). OpenAI and Responses clients (Codex) read the error ``code``
``context_length_exceeded`` (openai/codex ``ContextWindowExceeded``; PROTOCOLS.md 3.4).

The upstream wordings read (each with its source; tests/proxy/guard/test_overflow.py holds them):

- OpenAI / DeepSeek / Groq: ``This model's maximum context length is L tokens. However, you requested T
  tokens (P in the messages, O in the completion)`` and ``... your messages resulted in P tokens``;
- vLLM: ``... you requested O output tokens and your prompt contains at least P input tokens``,
  ``'max_tokens' ... is too large: O. This model's maximum context length is L tokens and your request
  has P input tokens`` (vllm-project/vllm#20409, #42474), ``The input (P tokens) is longer than the
  model's context length (L tokens)`` (Alishahryar1/free-claude-code#263);
- SGLang: ``... maximum context length of L tokens. You requested a total of T tokens: P tokens from the
  input messages and O tokens for the completion`` (tokenizer_manager.py);
- llama.cpp server: ``request (P tokens) exceeds the available context size (L tokens)``, and the older
  ``the request exceeds the available context size`` (server.cpp ``exceed_context_size_error``);
- Moonshot (Kimi): ``exceeded model token limit: L (requested: T)`` (MoonshotAI/kimi-cli#2011);
- Qwen / DashScope: ``Range of input length should be [1, L]``;
- Zhipu (GLM): ``Prompt exceeds max length`` (code 1261);
- Mistral: ``Prompt contains P tokens and O draft tokens, too large for model with L maximum context
  length``; TGI: ``inputs tokens + max_new_tokens must be <= L. Given: P inputs tokens and O
  max_new_tokens``;
- Anthropic's own two wordings (above), when the upstream is another gateway in front of Claude.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The code every OpenAI-style client reads for a context overflow.
CODE = "context_length_exceeded"
_CAP = 4000
_N = r"(\d{1,12})"


@dataclass(frozen=True, slots=True)
class ContextOverflow:
    """What an upstream said of a request too long for its window, in tokens: ``limit`` (the window),
    ``prompt`` (the input), ``output`` (the output budget asked for), ``total`` (input and output
    together, where only that was said); None where it did not say. ``input_only``: the wording is
    about the input alone (no output budget can make it fit: Claude Code must compact, not lower
    ``max_tokens``)."""

    limit: int | None = None
    prompt: int | None = None
    output: int | None = None
    total: int | None = None
    input_only: bool = False


def _row(pattern: str, *names: str, input_only: bool = False) -> tuple[re.Pattern[str], tuple[str, ...], bool]:
    return re.compile(pattern, re.I), names, input_only


#: (pattern, the names of its groups in order, whether it speaks of the input alone). Most specific first.
_ROWS = (
    _row(r"input length and `?max_tokens`? exceed context limit: " + _N + r" \+ " + _N + " > " + _N,
         "prompt", "output", "limit"),
    _row(r"prompt is too long: " + _N + r" tokens > " + _N, "prompt", "limit", input_only=True),
    _row(r"maximum context length is " + _N + r" tokens\. However, you requested " + _N + r" tokens \(" + _N
         + r" in the messages, " + _N + r" in the completion\)", "limit", "total", "prompt", "output"),
    _row(r"maximum context length is " + _N + r" tokens\. However, you requested " + _N + r" tokens \(" + _N
         + r" in the messages, " + _N + r" in the functions, and " + _N + r" in the completion\)",
         "limit", "total", "prompt", "tools", "output"),
    _row(r"maximum context length is " + _N + r" tokens\. However, you requested " + _N + r" output tokens "
         r"and your prompt contains (?:at least )?" + _N + " input tokens", "limit", "output", "prompt"),
    _row(r"is too large: " + _N + r"\. This model's maximum context length is " + _N + r" tokens and your "
         r"request has " + _N + " input tokens", "output", "limit", "prompt"),
    _row(r"maximum context length is " + _N + r" tokens\. However, your (?:messages resulted in|request has) "
         + _N, "limit", "prompt", input_only=True),
    _row(r"maximum context length is " + _N + r" tokens\. However, you requested " + _N + r" tokens\.",
         "limit", "total"),
    _row(r"maximum context length of " + _N + r" tokens\. You requested a total of " + _N + r" tokens: " + _N
         + r" tokens from the input messages and " + _N, "limit", "total", "prompt", "output"),
    _row(r"the input \(" + _N + r" tokens\) is longer than the model's context length \(" + _N,
         "prompt", "limit", input_only=True),
    _row(r"input length \(" + _N + r" tokens\) exceeds the maximum allowed length \(" + _N,
         "prompt", "limit", input_only=True),
    _row(r"(?:decoder prompt \(length|prompt length of) " + _N + r"\)? is longer than the maximum model length of "
         + _N, "prompt", "limit", input_only=True),
    _row(r"request \(" + _N + r" tokens\) exceeds the available context size \(" + _N, "prompt", "limit",
         input_only=True),
    _row(r"n_prompt_tokens=" + _N + r", n_ctx=" + _N, "prompt", "limit", input_only=True),
    _row(r"exceeded model token limit: " + _N + r" \(requested: " + _N, "limit", "total"),
    _row(r"prompt contains " + _N + r" tokens and " + _N + r" draft tokens, too large for model with " + _N,
         "prompt", "output", "limit"),
    _row(r"must be <= " + _N + r"\. Given: " + _N + r" `?inputs`? tokens and " + _N, "limit", "prompt", "output"),
    _row(r"range of input length should be \[\s*\d+\s*,\s*" + _N, "limit", input_only=True),
    _row(r"maximum context length is " + _N, "limit"),
)
#: Phrases that say "too long for the window" without numbers.
_PHRASES = re.compile(r"exceeds? the available context size|context (?:length|window|size) (?:exceeded|is "
                      r"exceeded)|prompt exceeds max length|prompt is too long|input is too long|"
                      r"exceeds? (?:the )?(?:model'?s? )?(?:maximum )?context|context_length_exceeded|"
                      r"longer than the maximum model length|too many (?:input )?tokens", re.I)
#: Number-less phrases that speak of the input alone (Zhipu 1261, llama.cpp, vLLM).
_INPUT_PHRASES = re.compile(r"prompt exceeds max length|prompt is too long|input is too long|the request exceeds "
                            r"the available context size|longer than the maximum model length", re.I)


def read_overflow(message: object) -> ContextOverflow | None:
    """The overflow an upstream error ``message`` reports, or None when it reports none. Numbers
    outside 1..10^12 are dropped (a malicious upstream's figures are bounded like any other)."""
    if not isinstance(message, str) or not message:
        return None
    text = message[:_CAP]
    for pattern, names, input_only in _ROWS:
        match = pattern.search(text)
        if match is None:
            continue
        found = {name: int(value) for name, value in zip(names, match.groups(), strict=True) if 0 < int(value)}
        prompt, output, total = found.get("prompt"), found.get("output"), found.get("total")
        if prompt is not None and "tools" in found:
            prompt += found["tools"]  # OpenAI counts the functions apart; they are input all the same
        if prompt is None and total is not None and output is not None and output < total:
            prompt = total - output
        return ContextOverflow(found.get("limit"), prompt, output, None if prompt else total, input_only)
    if _PHRASES.search(text) is None:
        return None
    return ContextOverflow(input_only=_INPUT_PHRASES.search(text) is not None)


def anthropic_wording(overflow: ContextOverflow, *, prompt_estimate: int, budget: int | None) -> str:
    """The overflow as the Anthropic API words it (the texts Claude Code parses, module docstring).

    The prompt fits its window but not with the output budget: ``input length and `max_tokens` exceed
    context limit: P + B > L, ...`` (Claude Code retries with ``max_tokens`` = L - P - 1000 when that
    is at least 3000); else ``prompt is too long: P tokens > L maximum`` (it compacts). The prompt is
    the upstream's figure, else its total less the output ``budget`` (tokens, the request's), else
    ``prompt_estimate`` (toolrelay's count of the request). A wording about the input alone says the
    prompt is over the window whatever the estimate (an estimate below it would send Claude Code
    lowering a budget that cannot help); an unknown window is said as the prompt's size less one, the
    largest window the prompt provably overflows."""
    prompt = overflow.prompt or _from_total(overflow.total, budget) or max(1, prompt_estimate)
    output = overflow.output or budget
    limit = overflow.limit
    if overflow.input_only and limit is not None:
        prompt = max(prompt, limit + 1)
    if limit is not None and prompt < limit:
        asked = output if output is not None and prompt + output > limit else limit - prompt + 1
        return (f"input length and `max_tokens` exceed context limit: {prompt} + {asked} > {limit}, "
                f"decrease input length or `max_tokens` and try again")
    return f"prompt is too long: {prompt} tokens > {limit if limit is not None else max(1, prompt - 1)} maximum"


def _from_total(total: int | None, budget: int | None) -> int | None:
    """The prompt of a ``total`` (input and output, tokens) that asked for ``budget`` output tokens."""
    if total is None:
        return None
    return total - budget if budget is not None and 0 < budget < total else total
