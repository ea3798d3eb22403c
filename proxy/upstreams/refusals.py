"""What an upstream's refusal of a request parameter says, and how to ask again right.

Pure: bytes and dicts in, a ``Refused`` (which parameter, fixed how) or None out; no Django, no
I/O, never raises on any input. ``classify`` reads a non-200 answer against a table of the error
texts real upstreams send (each row names its family and where the text comes from); ``apply``
turns fixes into changes of a chat.completions body. The upstream client (``proxy.upstreams.client``) asks
again at once with the changes and remembers the fixes that hold for later requests
(``Fix.remember``): an output budget over the upstream's range is clamped to the range it named, a
parameter it refuses is left out. A window shared with the prompt (vLLM, SGLang, OpenRouter and
Moonshot context errors) is clamped for that request only: the room left depends on the prompt.
Unknown texts give None: the client gets the upstream's answer as before.

Sources of the texts (collected from public reports and the servers' code; tests/proxy/test_refusals.py
holds each one verbatim):

- DeepSeek: ``Invalid max_tokens value, the valid range of max_tokens is [1, 8192]``
  (deepseek-ai/DeepSeek-V3#69, Gitlawb/openclaude#35); ``deepseek-reasoner does not support this
  tool_choice`` (deepseek-ai/awesome-deepseek-integration#598).
- vLLM: ``tool_choice = "required" is not supported!`` (serving_chat.py before 0.8); context
  errors in three wordings (vllm-project/vllm#20409, #42474, stepfun-ai/Step-Audio-R1#3);
  ``max_tokens=N cannot be greater than max_model_len=...`` (mateaix/mateclaw#481); pydantic
  ``extra_forbidden`` (vllm-project/vllm#3657).
- SGLang: ``Requested token count exceeds the model's maximum context length of N tokens. You
  requested a total of T tokens: M tokens from the input messages ...`` (tokenizer_manager.py;
  anomalyco/opencode#25230).
- llama.cpp server: ``Unsupported param: tool_choice`` (without ``--jinja``), ``Invalid
  tool_choice: X`` (utils.hpp, chat.cpp).
- Ollama: ``"llama3.1:8b" does not support thinking`` (Gitlawb/openclaude#1371), ``think value
  "medium" is not supported for this model`` (ollama/ollama#12561).
- Qwen / DashScope: ``<400> InternalError.Algo.InvalidParameter: Range of max_tokens should be [1,
  8192]`` (musistudio/claude-code-router#184, open-webui/open-webui#10507).
- Moonshot (Kimi): ``Invalid request: Your request exceeded model token limit: 262144 (requested:
  269030)`` (MoonshotAI/kimi-cli#2011); ``tool_choice 'required' is incompatible with thinking
  enabled`` (AstrBotDevs/AstrBot#7805); ``invalid temperature: only 1 is allowed for this model``.
- Zhipu (GLM): ``max_tokens参数非法。请检查文档。`` (code 1214; lobehub/lobehub#1398).
- Groq: ``max_tokens must be less than or equal to 16384, ...`` (RooCodeInc/Roo-Code#5729);
  ``\\`reasoning_effort\\` is not supported with this model`` (iamsrikanthnani/pluely#242).
- OpenRouter: ``No endpoints found that support the provided 'tool_choice' value``
  (zed-industries/zed#36094); its context error ``... requested about T tokens (... N in the
  output)``; provider errors wrapped in ``error.metadata.raw`` (a JSON string, read too).
- OpenAI-style wordings other servers copy: ``Unrecognized request argument supplied: X``,
  ``Unsupported parameter: 'X' is not supported with this model``, ``Invalid value for
  'parallel_tool_calls': ... only allowed when 'tools' are specified``, ``max_tokens is too
  large: N. This model supports at most M completion tokens``; Volcengine Ark: ``... integer above
  maximum value, expected a value <= 32768``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: Statuses whose bodies are read for a parameter refusal (404: OpenRouter's "no endpoints"; 500: older
#: llama.cpp servers answered ``Unsupported param`` as a server error).
STATUSES = frozenset({400, 404, 422, 500})
#: The output budget: one parameter for the fixes, whichever field the body uses.
BUDGET = "max_tokens"
BUDGET_FIELDS = ("max_tokens", "max_completion_tokens")
#: Never left out: without them the request is another request.
PROTECTED = frozenset({"model", "messages", "stream", "tools", "functions", "response_format", "prompt"})
#: Left out when an error names them in any refusal wording: their absence never changes what is asked.
OPTIONAL = ("stream_options", "parallel_tool_calls", "reasoning_effort", "reasoning", "logprobs",
            "top_logprobs", "seed", "user", "metadata", "store", "service_tier", "presence_penalty",
            "frequency_penalty", "logit_bias", "top_k", "min_p", "repetition_penalty", "prediction",
            "modalities", "thinking", "enable_thinking", "chat_template_kwargs", "safety_identifier",
            "prompt_cache_key", "verbosity", "web_search_options")
_REFUSAL_WORDS = re.compile(
    r"unrecogni[sz]ed|unknown|unsupported|not supported|does not support|doesn't support|not allowed|"
    r"only allowed|not permitted|extra (?:inputs|fields)|extra_forbidden|invalid|not valid|incompatible|"
    r"cannot|can't|not available|unexpected", re.I)
_TEXT_CAP = 16 * 1024
_MESSAGE_CAP = 300
_NEST_LIMIT = 10


@dataclass(frozen=True, slots=True)
class Fix:
    """One change that answers a refusal.

    ``parameter``: a body field (``max_tokens`` stands for the output budget, whichever of
    ``max_tokens`` / ``max_completion_tokens`` the body uses), or ``tool_choice=<class>`` for one
    class of ``tool_choice`` value (``tool_choice_class``). ``limit``: the largest value to send (a
    clamp), or None to leave the parameter out. ``remember``: the fix holds for later requests to
    the same upstream and model (False: it depends on this request's prompt).
    """

    parameter: str
    limit: int | None = None
    remember: bool = True

    def describe(self) -> str:
        """``max_tokens <= 8192`` or ``stream_options left out``."""
        return f"{self.parameter} <= {self.limit}" if self.limit is not None else f"{self.parameter} left out"


@dataclass(frozen=True, slots=True)
class Refused:
    """A refusal understood: the upstream ``family`` whose wording matched, the ``fixes`` that change the
    sent body, and the upstream's ``message`` (capped at 300 characters)."""

    family: str
    fixes: tuple[Fix, ...]
    message: str


def tool_choice_class(value: Any) -> str:
    """The class of a chat ``tool_choice`` value: ``auto``, ``none``, ``required``, ``function`` (a named
    function object) or ``other``; '' when absent."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value if value in ("auto", "none", "required") else "other"
    if isinstance(value, dict) and value.get("type") == "function":
        return "function"
    return "other"


# ----- reading the error body -----

def _strings(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a decoded JSON value; a string holding JSON (OpenRouter's ``metadata.raw``) is
    read too, up to ``_NEST_LIMIT`` levels deep."""
    if depth > _NEST_LIMIT:
        return
    if isinstance(value, str):
        if value[:1] in "{[":
            try:
                inner = json.loads(value)
            except (ValueError, RecursionError):
                inner = None
            if isinstance(inner, dict | list):
                yield from _strings(inner, depth + 1)
                return
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item, depth + 1)


def _extra_fields(value: Any, depth: int = 0) -> Iterator[str]:
    """Top-level body fields a pydantic ``extra_forbidden`` error names (FastAPI's 422 ``detail`` list)."""
    if depth > _NEST_LIMIT:
        return
    if isinstance(value, dict):
        loc = value.get("loc")
        if value.get("type") == "extra_forbidden" and isinstance(loc, list) and len(loc) == 2 and loc[0] == "body":
            if isinstance(loc[1], str):
                yield loc[1]
        for item in value.values():
            yield from _extra_fields(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _extra_fields(item, depth + 1)


def _decoded(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return body.decode("utf-8", "replace")


def _message(obj: Any, text: str) -> str:
    """The upstream's own sentence: ``error.message`` (or ``message`` / ``detail`` / ``msg``), else the text."""
    seen = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(seen, dict):
        for key in ("message", "detail", "msg"):
            value = seen.get(key)
            if isinstance(value, str) and value:
                return value[:_MESSAGE_CAP]
    return text[:_MESSAGE_CAP]


# ----- the table -----

Builder = Callable[[re.Match[str], Mapping[str, Any]], tuple[Fix, ...]]


@dataclass(frozen=True, slots=True)
class _Row:
    family: str
    pattern: re.Pattern[str]
    build: Builder


def _int(text: str) -> int:
    return int(text) if text.isdigit() and len(text) < 12 else -1


def _budget_sent(sent: Mapping[str, Any]) -> int | None:
    values = [v for f in BUDGET_FIELDS if isinstance(v := sent.get(f), int) and not isinstance(v, bool)]
    return max(values) if values else None


def _clamp(name: int, limit: int) -> Builder:
    """Groups ``name`` (the parameter) and ``limit`` (the upstream's largest value): remembered."""
    def build(match: re.Match[str], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
        parameter = match.group(name)
        parameter = BUDGET if parameter in BUDGET_FIELDS else parameter
        value = _int(match.group(limit))
        return (Fix(parameter, value),) if value >= 1 else ()
    return build


def _window(size: int, used: int, margin: int = 0) -> Builder:
    """A context window of ``size`` tokens of which the prompt takes ``used``: the output budget may take
    the rest, for this request only (``margin``: tokens the server keeps back, SGLang's ``>=``)."""
    def build(match: re.Match[str], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
        room = _int(match.group(size)) - _int(match.group(used)) - margin
        return (Fix(BUDGET, room, remember=False),) if room >= 1 and _int(match.group(used)) >= 0 else ()
    return build


def _window_total(size: int, total: int, output: int) -> Builder:
    """OpenRouter's wording: the window, the estimated total and the output part of it."""
    def build(match: re.Match[str], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
        prompt = _int(match.group(total)) - _int(match.group(output))
        room = _int(match.group(size)) - prompt
        return (Fix(BUDGET, room, remember=False),) if room >= 1 and prompt >= 0 else ()
    return build


def _over(limit: int, requested: int) -> Builder:
    """Moonshot's wording: the window and the requested total (prompt + the sent output budget)."""
    def build(match: re.Match[str], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
        budget = _budget_sent(sent)
        if budget is None:
            return ()
        room = budget - (_int(match.group(requested)) - _int(match.group(limit)))
        return (Fix(BUDGET, room, remember=False),) if 1 <= room < budget else ()
    return build


def _drop(name: int | str) -> Builder:
    """Leave out the parameter in group ``name`` (or the named parameter); remembered."""
    def build(match: re.Match[str], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
        parameter = match.group(name) if isinstance(name, int) else name
        if parameter == "tool_choice":
            return (Fix(f"tool_choice={tool_choice_class(sent.get('tool_choice'))}"),)
        if parameter in BUDGET_FIELDS:
            parameter = BUDGET
        return (Fix(parameter),)
    return build


def _drop_listed(name: int) -> Builder:
    """Leave out each parameter of a comma-separated list in group ``name``."""
    def build(match: re.Match[str], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
        return tuple(Fix(p.strip()) for p in match.group(name).split(",") if p.strip())
    return build


def _drop_choice(sent_class: int | None = None) -> Builder:
    """Leave out ``tool_choice`` values of the class the upstream named (group) or of the one sent."""
    def build(match: re.Match[str], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
        named = match.group(sent_class) if sent_class is not None else ""
        named = {"specified": "function"}.get(named, named)
        return (Fix(f"tool_choice={named or tool_choice_class(sent.get('tool_choice'))}"),)
    return build


def _drop_thinking(match: re.Match[str], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
    """Ollama's model without thinking: leave out what turns thinking on (its OpenAI layer reads both)."""
    return (Fix("reasoning_effort"), Fix("reasoning"))


_I = re.I
_ROWS: tuple[_Row, ...] = (
    # Output budgets over the upstream's own range: clamped, remembered.
    _Row("deepseek", re.compile(r"Invalid (max_tokens|max_completion_tokens) value, the valid range of "
                                r"\w+ is \[\s*\d+\s*,\s*(\d+)\s*\]", _I), _clamp(1, 2)),
    _Row("dashscope", re.compile(r"Range of (max_tokens|max_completion_tokens|n) should be "
                                 r"\[\s*\d+\s*,\s*(\d+)\s*\]", _I), _clamp(1, 2)),
    _Row("groq", re.compile(r"(?<!\w)`?(max_tokens|max_completion_tokens|n)`? must be "
                            r"(?:less than or equal to|<=|at most) `?(\d+)", _I), _clamp(1, 2)),
    _Row("openai", re.compile(r"(max_tokens|max_completion_tokens) is too large: \d+\. This model supports at most "
                              r"(\d+) completion tokens", _I), _clamp(1, 2)),
    _Row("volcengine", re.compile(r"parameter `?(max_tokens|max_completion_tokens)`? specified in the request "
                                  r"(?:is|are) not valid: integer above maximum value, expected a value <= (\d+)", _I),
         _clamp(1, 2)),
    _Row("vllm", re.compile(r"(max_tokens|max_completion_tokens)=\d+ cannot be greater than "
                            r"max_model_len=(?:max_total_tokens=)?(\d+)", _I), _clamp(1, 2)),
    # Windows shared with the prompt: clamped for this request only.
    _Row("vllm", re.compile(r"is too large: \d+\. This model's maximum context length is (\d+) tokens and your "
                            r"request has (\d+) input tokens", _I), _window(1, 2)),
    _Row("vllm", re.compile(r"maximum context length is (\d+) tokens\. However, you requested \d+ output tokens and "
                            r"your prompt contains (?:at least )?(\d+) input tokens", _I), _window(1, 2)),
    _Row("vllm", re.compile(r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens "
                            r"\((\d+) in the messages, \d+ in the completion\)", _I), _window(1, 2)),
    _Row("sglang", re.compile(r"maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: "
                              r"(\d+) tokens from the input messages", _I), _window(1, 2, margin=1)),
    _Row("openrouter", re.compile(r"maximum context length is (\d+) tokens\. However, you requested about (\d+) "
                                  r"tokens \([^)]*?(\d+) in the output\)", _I), _window_total(1, 2, 3)),
    _Row("moonshot", re.compile(r"exceeded model token limit: (\d+) \(requested: (\d+)\)", _I), _over(1, 2)),
    # Values and parameters refused outright: left out, remembered.
    _Row("vllm", re.compile(r'tool_choice = "(\w+)" is not supported', _I), _drop_choice(1)),
    _Row("deepseek", re.compile(r"does not support this [`']?tool_choice", _I), _drop_choice()),
    _Row("moonshot", re.compile(r"tool_choice '?(\w+)'? is incompatible with thinking enabled", _I), _drop_choice(1)),
    _Row("llamacpp", re.compile(r"Invalid tool_choice: (auto|none|required)\b"), _drop_choice(1)),
    _Row("openrouter", re.compile(r"No endpoints found that support the provided '(\w+)' value", _I), _drop(1)),
    _Row("llamacpp", re.compile(r"Unsupported param: (\w+)"), _drop(1)),
    _Row("openai", re.compile(r"Unrecognized request arguments? supplied: ([\w, ]+)", _I), _drop_listed(1)),
    _Row("openai", re.compile(r"Unsupported parameter: '(\w+)' is not supported with this model", _I), _drop(1)),
    _Row("openai", re.compile(r"Invalid value for '(\w+)': '\w+' is only allowed when", _I), _drop(1)),
    _Row("pydantic", re.compile(r"""extra_forbidden['"]\s*,\s*['"]loc['"]\s*:\s*[\[(]\s*['"]body['"]\s*,\s*"""
                                r"""['"](\w+)['"]\s*[\])]"""), _drop(1)),
    _Row("groq", re.compile(r"`(\w+)` is not supported with this model", _I), _drop(1)),
    _Row("groq", re.compile(r"property '(\w+)' is unsupported", _I), _drop(1)),
    _Row("ollama", re.compile(r"does not support thinking|think value \"?\w+\"? is not supported", _I), _drop_thinking),
    _Row("moonshot", re.compile(r"invalid temperature: only [\d.]+ is allowed", _I), _drop("temperature")),
    _Row("zhipu", re.compile(r"([a-z_]+)\s*参数非法"), _drop(1)),
)


def _optional_named(text: str, sent: Mapping[str, Any]) -> tuple[Fix, ...]:
    """An optional parameter the body carries, named in the error beside a refusal word (any wording)."""
    if not _REFUSAL_WORDS.search(text):
        return ()
    return tuple(Fix(p) for p in OPTIONAL if p in sent and re.search(rf"(?<![\w.]){p}(?![\w])", text))


# ----- the fixes against a body -----

def _field_changes(body: Mapping[str, Any], field: str, limit: int | None) -> dict[str, Any]:
    value = body.get(field)
    if field not in body:
        return {}
    if limit is None:
        return {field: None}
    if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
        return {field: limit}
    return {}


def apply(body: Mapping[str, Any], fixes: Iterable[Fix]) -> dict[str, Any]:
    """The changes ``fixes`` make to chat.completions ``body``: field -> new value, None for a field left
    out. Only what changes is returned (a clamp above the sent value, a field the body lacks: nothing)."""
    changes: dict[str, Any] = {}
    for fix in fixes:
        if fix.parameter == BUDGET:
            for field in BUDGET_FIELDS:
                changes.update(_field_changes(body, field, fix.limit))
        elif fix.parameter.startswith("tool_choice="):
            if tool_choice_class(body.get("tool_choice")) == fix.parameter.partition("=")[2]:
                changes["tool_choice"] = None
        elif fix.parameter not in PROTECTED:
            changes.update(_field_changes(body, fix.parameter, fix.limit))
    return changes


def _useful(fixes: Iterable[Fix], sent: Mapping[str, Any]) -> tuple[Fix, ...]:
    return tuple(f for f in fixes if apply(sent, (f,)))


def classify(status: int, body: bytes, sent: Mapping[str, Any]) -> Refused | None:
    """What the upstream's non-200 answer (``status``, capped ``body``) refuses of the ``sent`` body, with
    the fixes that change it; None when the answer names no parameter the body carries that can be
    clamped or left out (then the client gets the answer). Never raises."""
    if status not in STATUSES or not isinstance(body, bytes | bytearray) or not isinstance(sent, Mapping):
        return None
    try:
        return _classify(bytes(body[:_TEXT_CAP]), sent)
    except Exception:  # noqa: BLE001 - garbage in, no refusal out: the client gets the upstream's answer
        return None


def _classify(body: bytes, sent: Mapping[str, Any]) -> Refused | None:
    obj = _decoded(body)
    strings = list(_strings(obj))
    text = "\n".join(strings)[:_TEXT_CAP] if strings else str(obj)[:_TEXT_CAP]
    message = _message(obj, text)
    for row in _ROWS:
        match = row.pattern.search(text)
        if match is not None:
            fixes = _useful(row.build(match, sent), sent)
            if fixes:
                said = next((s for s in strings if row.pattern.search(s)), message)
                return Refused(row.family, fixes, said[:_MESSAGE_CAP])
    fixes = _useful((Fix(f) for f in _extra_fields(obj)), sent)
    if fixes:
        return Refused("pydantic", fixes, message)
    fixes = _useful(_optional_named(text, sent), sent)
    return Refused("any", fixes, message) if fixes else None
