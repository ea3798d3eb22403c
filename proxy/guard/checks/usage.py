"""An upstream's usage object, read right and bounded: ``read_usage(obj) -> Usage`` (pure, never raises).

Every upstream family toolrelay targets reports usage in the chat.completions ``usage`` object, each
with its own fields for what was cached and what was reasoning (wire-format sources in brackets):

- OpenAI: ``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``,
  ``completion_tokens_details.reasoning_tokens`` (reasoning is part of ``completion_tokens``)
  [platform.openai.com/docs/api-reference/chat/object];
- DeepSeek: ``prompt_cache_hit_tokens`` + ``prompt_cache_miss_tokens`` = ``prompt_tokens``
  [api-docs.deepseek.com/guides/kv_cache];
- Kimi (Moonshot): ``cached_tokens`` at the top level of ``usage``, or OpenAI's details
  [platform.moonshot.ai, context caching];
- GLM (Zhipu), vLLM (``--enable-prompt-tokens-details``), SGLang, MiniMax: OpenAI's
  ``prompt_tokens_details.cached_tokens`` / ``completion_tokens_details.reasoning_tokens``;
- Qwen / DashScope compatible mode: OpenAI's details plus, for explicit caching,
  ``prompt_tokens_details.cache_creation_input_tokens`` (or ``cache_creation.ephemeral_5m_input_tokens``)
  [help.aliyun.com, context cache];
- Anthropic-shaped usage some gateways relay: ``input_tokens`` (uncached), ``output_tokens``,
  ``cache_read_input_tokens``, ``cache_creation_input_tokens``; OpenRouter-style
  ``prompt_tokens_details.cache_write_tokens``.

``Usage.prompt`` is every input token (cached and written included, OpenAI's meaning); ``cache_read``
and ``cache_write`` are parts of it; ``reasoning`` is part of ``completion``. Every field must be a
non-negative integer of at most ``MAX_TOKENS``: anything else (a string, a float, a negative, ``10**20``)
is an anomaly (``Usage.anomalies``, each a sentence the caller records as a finding) and the field is
unknown; an unknown ``prompt`` or ``completion`` makes the usage ``estimated`` (the caller fills it in).
Parts larger than their whole are clamped to it, with an anomaly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

#: The most tokens one usage field may say (larger: not a count, an anomaly). 100 million: above any
#: context window or output budget an upstream serves today, far below what breaks a 64-bit counter.
MAX_TOKENS = 100_000_000
#: Characters of a rejected value quoted in its anomaly.
_QUOTE = 40


@dataclass(frozen=True, slots=True)
class Usage:
    """One attempt's tokens. ``prompt`` and ``completion`` None when the upstream did not say (or said
    nonsense); ``cache_read`` / ``cache_write`` within ``prompt``, ``reasoning`` within ``completion``;
    ``estimated`` True when a count was estimated (``with_estimate``); ``anomalies``: what was refused."""

    prompt: int | None = None
    completion: int | None = None
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int = 0
    estimated: bool = False
    anomalies: tuple[str, ...] = field(default=())

    @property
    def known(self) -> bool:
        """True when both the input and the output count came from the upstream."""
        return self.prompt is not None and self.completion is not None

    @property
    def fresh_input(self) -> int:
        """Input tokens neither read from nor written to a cache (priced at the input price)."""
        return max(0, (self.prompt or 0) - self.cache_read - self.cache_write)

    @property
    def plain_output(self) -> int:
        """Output tokens that are not reasoning (priced at the output price)."""
        return max(0, (self.completion or 0) - self.reasoning)

    def with_estimate(self, prompt: int, completion: int) -> Usage:
        """This usage with the unknown counts replaced by ``prompt`` / ``completion`` (bounded), marked
        ``estimated`` when anything was replaced."""
        if self.known:
            return self
        total_in = self.prompt if self.prompt is not None else _bound(prompt)
        total_out = self.completion if self.completion is not None else _bound(completion)
        read = min(self.cache_read, total_in)
        return replace(
            self,
            prompt=total_in,
            completion=total_out,
            cache_read=read,
            cache_write=min(self.cache_write, total_in - read),
            reasoning=min(self.reasoning, total_out),
            estimated=True,
        )

    def openai(self) -> dict[str, Any]:
        """OpenAI's usage object for these counts (``prompt_tokens_details`` / ``completion_tokens_details``)."""
        prompt, completion = self.prompt or 0, self.completion or 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.cache_read},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning},
        }

    def anthropic(self) -> dict[str, int]:
        """Anthropic's usage (PROTOCOLS.md 2.7): ``input_tokens`` excludes cache reads and writes."""
        return {
            "input_tokens": self.fresh_input,
            "output_tokens": self.completion or 0,
            "cache_creation_input_tokens": self.cache_write,
            "cache_read_input_tokens": self.cache_read,
        }

    def responses(self) -> dict[str, Any]:
        """The Responses API's usage (PROTOCOLS.md 3.4): ``input_tokens`` includes the cached ones."""
        prompt, completion = self.prompt or 0, self.completion or 0
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": self.cache_read, "cache_write_tokens": self.cache_write},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": self.reasoning},
            "total_tokens": prompt + completion,
        }


def _bound(value: int) -> int:
    return min(MAX_TOKENS, max(0, value))


class _Reader:
    """Reads fields of one usage object, collecting anomalies."""

    def __init__(self) -> None:
        self.anomalies: list[str] = []

    def count(self, obj: Any, name: str, where: str = "usage") -> int | None:
        """The field ``name`` of ``obj`` as a bounded count; None when absent, null or refused."""
        if not isinstance(obj, dict) or name not in obj:
            return None
        value = obj[name]
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_TOKENS:
            return int(value)  # 12.0: a count written as a float by some servers
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
            return value
        self.anomalies.append(
            f"{where}.{name} is not a token count (0 to {MAX_TOKENS:,}): {_quote(value)}; estimated instead"
        )
        return None

    def part(self, value: int | None, whole: int | None, name: str, of: str) -> int:
        if value is None:
            return 0
        if whole is not None and value > whole:
            self.anomalies.append(f"usage {name} ({value}) exceeds {of} ({whole}); clamped to it")
            return whole
        return value


def _quote(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an object whose repr fails is still no count
        text = type(value).__name__
    return text if len(text) <= _QUOTE else text[:_QUOTE] + "..."


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _totals(r: _Reader, obj: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(prompt, completion)``: OpenAI's names, else DeepSeek's hit + miss, else Anthropic's (whose
    ``input_tokens`` excludes the cache)."""
    prompt, completion = r.count(obj, "prompt_tokens"), r.count(obj, "completion_tokens")
    if prompt is None and "prompt_tokens" not in obj:
        a_input = r.count(obj, "input_tokens")
        hit, miss = obj.get("prompt_cache_hit_tokens"), obj.get("prompt_cache_miss_tokens")
        if a_input is not None:
            cached = (r.count(obj, "cache_read_input_tokens", "(quiet)") or 0) + (
                r.count(obj, "cache_creation_input_tokens", "(quiet)") or 0)
            prompt = _bound(a_input + cached)
        elif isinstance(hit, int) and isinstance(miss, int) and not isinstance(hit, bool) | isinstance(miss, bool):
            prompt = _bound(hit + miss) if hit >= 0 and miss >= 0 else None
    if completion is None and "completion_tokens" not in obj:
        completion = r.count(obj, "output_tokens")
    r.anomalies = [a for a in r.anomalies if not a.startswith("(quiet)")]  # reported once, by _parts
    return prompt, completion


def _parts(r: _Reader, obj: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """``(cache read, cache write, reasoning)`` as each family names them (module docstring)."""
    pd, cd = obj.get("prompt_tokens_details"), obj.get("completion_tokens_details")
    creation = pd.get("cache_creation") if isinstance(pd, dict) else None
    details = "usage.prompt_tokens_details"
    cache_read = _first(r.count(pd, "cached_tokens", details), r.count(obj, "prompt_cache_hit_tokens"),
                        r.count(obj, "cached_tokens"), r.count(obj, "cache_read_input_tokens"))
    r.count(obj, "prompt_cache_miss_tokens")  # checked: nonsense there is an anomaly too
    cache_write = _first(r.count(pd, "cache_creation_input_tokens", details),
                         r.count(pd, "cache_write_tokens", details),
                         r.count(creation, "ephemeral_5m_input_tokens", f"{details}.cache_creation"),
                         r.count(obj, "cache_creation_input_tokens"))
    reasoning = _first(r.count(cd, "reasoning_tokens", "usage.completion_tokens_details"),
                       r.count(obj, "reasoning_tokens"))
    return cache_read, cache_write, reasoning


def read_usage(obj: Any) -> Usage:
    """The ``Usage`` of an upstream usage object (any shape in the module docstring; anything that is not
    a dict: unknown usage, no anomaly). Never raises."""
    if not isinstance(obj, dict):
        return Usage()
    r = _Reader()
    prompt, completion = _totals(r, obj)
    cache_read, cache_write, reasoning = _parts(r, obj)
    read = r.part(cache_read, prompt, "cache read tokens", "prompt_tokens")
    rest = None if prompt is None else prompt - read
    write = r.part(cache_write, rest, "cache write tokens", "prompt_tokens less cache reads")
    thought = r.part(reasoning, completion, "reasoning tokens", "completion_tokens")
    return Usage(prompt=prompt, completion=completion, cache_read=read, cache_write=write, reasoning=thought,
                 anomalies=tuple(r.anomalies))


__all__ = ["MAX_TOKENS", "Usage", "read_usage"]
