"""From (scenario, request, attempt) to the :class:`Reply` the server writes, with its timing.

All randomness comes from RNGs seeded with (seed, sha256 of ``messages``, attempt), so a run is
reproducible: the same request at the same attempt gets the same turn and the same fault. The turn
RNG does not depend on the scenario text, so ``gen:corrupt=1:...`` and ``gen:corrupt=0`` give the
same underlying turn for the same messages and seed.
"""

from __future__ import annotations

import json
import os.path
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.simulator import cases, cut, faults, frames, hostile, refusals, task
from proxy.simulator.scenario import Scenario, ScenarioError
from proxy.simulator.turns import GenOptions, Turn, declared_tools, generate_turn, text_turn

SSE = "text/event-stream; charset=utf-8"
JSON = "application/json"


@dataclass(frozen=True)
class SimConfig:
    """Server-wide defaults (the command's flags); scenario options override them per request.

    ``kinds`` is a validated tuple (see :func:`faults.parse_kinds`); times are milliseconds.
    ``require_key``: None accepts any request, ``"*"`` any non-empty bearer, else that exact key.
    """

    cases_dir: Path | None = None
    corruption_rate: float = 0.0
    kinds: tuple[str, ...] = tuple(faults.FAULTS)
    ttft_ms: float = 0.0
    frame_ms: float = 0.0
    seed: int = 0
    require_key: str | None = None
    reject_stream_options: bool = False
    stats_limit: int = 10_000


@dataclass
class Reply:
    """What to send: ``pieces`` of an SSE body (chunked) or one fixed body, and when.

    ``first_byte_delay`` and ``frame_gap`` are seconds; ``stall_after`` = (frames, seconds);
    ``drop_after`` = frames written before the connection is closed without a terminator.
    """

    status: int
    content_type: str
    pieces: list[bytes]
    streamed: bool
    headers: list[tuple[str, str]] = field(default_factory=list)
    first_byte_delay: float = 0.0
    frame_gap: float = 0.0
    stall_after: tuple[int, float] | None = None
    drop_after: int | None = None
    fault: str | None = None


@dataclass(frozen=True)
class PlanContext:
    """Everything a plan depends on."""

    body: dict[str, Any]
    scenario: Scenario
    attempt: int
    digest: str  # sha256 hex of the request's ``messages``
    config: SimConfig
    library: cases.CaseLibrary

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options")
        return self.stream and isinstance(options, dict) and bool(options.get("include_usage"))

    @property
    def broken(self) -> bool:
        """Whether this attempt gets the scenario's failure (``broken=N``: the first N attempts)."""
        limit = self.scenario.options.get("broken")
        return limit is None or self.attempt <= self.scenario.get_int("broken", 0)

    def seconds(self, option: str, default_ms: float) -> float:
        return self.scenario.get_float(option, default_ms) / 1000

    def rng(self, purpose: str) -> random.Random:
        seed = self.scenario.get_int("seed", self.config.seed)
        # Not security: a reproducible simulation stream.
        return random.Random(f"{seed}|{purpose}|{self.digest}|{self.attempt}")  # noqa: S311


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> bytes:
    """An OpenAI-style error object (PROTOCOLS.md 1.6)."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def error_reply(status: int, message: str, kind: str, code: str | None = None, param: str | None = None) -> Reply:
    """A JSON error answer."""
    return Reply(status, JSON, [error_body(message, kind, code, param)], streamed=False)


def plan(ctx: PlanContext) -> Reply:
    """The reply for one request. Raises ScenarioError / CaseNotFound for bad scenarios."""
    refused = _refused(ctx)
    if refused is not None:
        return refused
    mode = ctx.scenario.mode
    if mode == "case":
        return _plan_case(ctx)
    if mode in ("text", "slow"):
        return _plan_text(ctx)
    if mode == "gen":
        return _plan_gen(ctx)
    if mode == "task":
        return _plan_task(ctx)
    if mode == "cut":
        return _plan_cut(ctx)
    return _plan_failure(ctx)


def _refused(ctx: PlanContext) -> Reply | None:
    """``refuse=...``: the refusal of a parameter the request carries, as that upstream family words it."""
    value = ctx.scenario.options.get("refuse")
    if not value:
        return None
    try:
        refused = refusals.refusal(value, ctx.body)
    except ValueError as exc:
        raise ScenarioError(f"{ctx.scenario.text}: {exc}") from None
    if refused is None:
        return None
    return Reply(refused.status, JSON, [refused.encoded()], streamed=False, fault=f"refused:{refused.name}")


def _plan_case(ctx: PlanContext) -> Reply:
    case = ctx.library.get(ctx.scenario.value or "")
    timing = {"first_byte_delay": ctx.seconds("ttft", ctx.config.ttft_ms)}
    timing["frame_gap"] = ctx.seconds("frame", ctx.config.frame_ms)
    if not ctx.broken:
        reply = _turn_reply(ctx, cases.clean_turn(case, ctx.body, ctx.rng("turn")), None)
        return _timed(reply, **timing)
    answer = cases.broken_answer(case)
    reply = Reply(answer.status, answer.content_type, list(answer.pieces), answer.streamed, fault=case["kind"])
    return _timed(reply, **timing)


def _plan_text(ctx: PlanContext) -> Reply:
    slow = ctx.scenario.mode == "slow"
    count = ctx.scenario.int_value() if ctx.scenario.value else 100
    turn = text_turn(ctx.body, count, ctx.rng("turn"), ctx.scenario.get_int("piece", 0))
    reply = _turn_reply(ctx, turn, None)
    gap = ctx.seconds("frame", 100 if slow else ctx.config.frame_ms)
    return _timed(reply, first_byte_delay=ctx.seconds("ttft", ctx.config.ttft_ms), frame_gap=gap)


def _plan_gen(ctx: PlanContext, *, clean: bool = False) -> Reply:
    """A generated turn; corrupted with probability ``corrupt`` (1 / 0 under ``broken=N``)."""
    scenario, config = ctx.scenario, ctx.config
    rate = 0.0 if clean else _fault_rate(ctx)
    looping = scenario.get_int("loop", 0) != 0
    options = GenOptions(
        frames=scenario.get_int("frames", 0) if "frames" in scenario.options else None,
        calls=scenario.get_int("calls", 2),
        text=scenario.get_int("text", 1) != 0,
        reasoning=scenario.get_int("reasoning", 0) != 0,
        rounds=_LOOPING if looping else scenario.get_int("rounds", 0) if "rounds" in scenario.options else None,
        seed=scenario.get_int("seed", config.seed),
    )
    turn = generate_turn(ctx.body, options, _loop_rng(ctx) if looping else ctx.rng("turn"))
    if looping:  # the same call, but a fresh id each turn (as real upstreams give)
        for number, call in enumerate(turn.calls):
            call.id = f"call_{ctx.digest[:20]}{number:02d}"
    fault = _draw_fault(ctx, turn, rate) if rate > 0 else None
    reply = _turn_reply(ctx, turn, fault)
    return _timed(
        reply,
        first_byte_delay=ctx.seconds("ttft", config.ttft_ms),
        frame_gap=ctx.seconds("frame", config.frame_ms),
    )


def _plan_task(ctx: PlanContext) -> Reply:
    """``task:steps=N:rate=P:seed=S[:kinds=...]``: the scripted multi-step task (``task.py``); a tool
    turn is corrupted with probability ``rate`` (default kinds ``task.TASK_KINDS``), text never."""
    scenario = ctx.scenario
    turn = task.task_turn(ctx.body, scenario.get_int("steps", 10), ctx.rng("turn"))
    fault = None
    if turn.calls:
        kinds = scenario.options.get("kinds") or ",".join(task.TASK_KINDS)
        fault = _draw_fault(ctx, turn, scenario.get_float("rate", 0.0), kinds)
    return _timed(
        _turn_reply(ctx, turn, fault),
        first_byte_delay=ctx.seconds("ttft", ctx.config.ttft_ms),
        frame_gap=ctx.seconds("frame", ctx.config.frame_ms),
    )


def _plan_cut(ctx: PlanContext) -> Reply:
    """``cut=F[:how=drop|eof|stall][:accept=both|deepseek|vllm|none][:chars=N][:utf8=0|1]``: a text stream cut
    at fraction F of a deterministic generation; a continuation request gets the rest (``cut.py``)."""
    scenario = ctx.scenario
    fraction, how, accept = cut.options(scenario)
    prefix, messages = cut.prefix_of(ctx.body, accept)
    text = cut.generation(scenario.get_int("seed", ctx.config.seed), messages, scenario.get_int("chars", 600))
    continuing = isinstance(ctx.body.get("messages"), list) and len(messages) < len(ctx.body["messages"])
    if prefix is not None:
        text = text[len(os.path.commonprefix([prefix, text])):]
    events, offsets = cut.stream_pieces(text, ctx.rng("cut"), ctx.body, utf8=scenario.get_int("utf8", 1) != 0,
                                        include_usage=ctx.include_usage)
    reply = Reply(200, SSE, events, streamed=True)
    if not continuing and ctx.broken and ctx.stream:
        head, whole = cut.cut_at(events, offsets, int(fraction * len(text)))
        reply.fault = f"cut-{how}"
        if how == "stall":
            reply.stall_after = (whole, ctx.seconds("ms", 60_000))
        else:
            reply.pieces = head
            reply.drop_after = len(head) if how == "drop" else None
    return _timed(reply, first_byte_delay=ctx.seconds("ttft", ctx.config.ttft_ms),
                  frame_gap=ctx.seconds("frame", ctx.config.frame_ms))


#: ``loop=1``: tool rounds are never over.
_LOOPING = 1 << 30


def _loop_rng(ctx: PlanContext) -> random.Random:
    """``loop=1``: the turn RNG of an agent stuck in a loop, seeded by the first user message alone, so
    every turn of the conversation replays the same tool call (name and arguments) whatever the tool results say."""
    messages = ctx.body.get("messages")
    first = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None) \
        if isinstance(messages, list) else None
    text = json.dumps(first.get("content") if first else None, sort_keys=True)
    seed = ctx.scenario.get_int("seed", ctx.config.seed)
    return random.Random(f"{seed}|loop|{text}")  # noqa: S311 - a reproducible simulation stream


def _fault_rate(ctx: PlanContext) -> float:
    if "broken" in ctx.scenario.options:
        return 1.0 if ctx.broken else 0.0
    return ctx.scenario.get_float("corrupt", ctx.config.corruption_rate)


def _draw_fault(
    ctx: PlanContext, turn: Turn, rate: float, spec: str | None = None
) -> tuple[faults.Fault, faults.FaultContext] | None:
    rng = ctx.rng("fault")
    if rng.random() >= rate:
        return None
    kinds = ctx.config.kinds
    if spec is None:
        spec = ctx.scenario.options.get("kinds")
    if spec is not None:
        try:
            kinds = faults.parse_kinds(spec)
        except ValueError as exc:
            raise ScenarioError(f"{ctx.scenario.text}: {exc}") from None
    fctx = faults.FaultContext(tools=declared_tools(ctx.body), rng=rng, include_usage=ctx.include_usage)
    picked = faults.pick_fault(kinds, turn, fctx, stream=ctx.stream)
    if picked is None:
        return None
    fctx.variant = picked[1]
    return picked[0], fctx


def _turn_reply(ctx: PlanContext, turn: Turn, fault: tuple[faults.Fault, faults.FaultContext] | None) -> Reply:
    """Frame (or serialise) ``turn``, applying ``fault`` at turn and stream level."""
    kind = fault[0].kind if fault else None
    _fixed_usage(ctx, turn)
    if fault and fault[0].on_turn:
        fault[0].on_turn(turn, fault[1])
    if turn.http_error:
        status, error = turn.http_error
        return Reply(status, JSON, [json.dumps(error).encode()], streamed=False, fault=kind)
    if not ctx.stream:
        body = json.dumps(frames.completion_body(turn)).encode()
        return Reply(200, JSON, [body], streamed=False, fault=kind)
    stream = frames.build_stream(turn, include_usage=ctx.include_usage)
    if ctx.scenario.options.get("usage-every") is not None:
        frames.usage_on_every_chunk(stream, turn.usage)
    if fault and fault[0].on_stream:
        fault[0].on_stream(stream, turn, fault[1])
    return Reply(200, SSE, frames.render_stream(stream), streamed=True, fault=kind)


def _fixed_usage(ctx: PlanContext, turn: Turn) -> None:
    """``usage=P/C[/R]``: the turn reports ``P`` prompt and ``C`` completion tokens (money tests), whatever its
    size, ``R`` of the prompt's read from the cache (``prompt_tokens_details.cached_tokens``, OpenAI's field)."""
    value = ctx.scenario.options.get("usage")
    if value is None:
        return
    parts = str(value).split("/")
    if len(parts) not in (2, 3) or not all(p.isdigit() and len(p) <= 9 for p in parts):
        raise ScenarioError(f"{ctx.scenario.text}: usage is P/C[/R], whole numbers (e.g. usage=11/7)")
    prompt, completion = int(parts[0]), int(parts[1])
    turn.usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if len(parts) == 3:
        turn.usage["prompt_tokens_details"] = {"cached_tokens": min(prompt, int(parts[2]))}


def _plan_failure(ctx: PlanContext) -> Reply:
    """``http:S``, ``stall-first-byte=MS``, ``stall-after=K``, ``drop-after=K``, ``hostile:KIND`` over a
    clean gen turn."""
    scenario = ctx.scenario
    if scenario.mode == "hostile":
        reply = _plan_gen(ctx, clean=True)
        return hostile.disturb(reply, ctx) if ctx.broken else reply
    if scenario.mode == "http":
        status = scenario.int_value()
        if not 400 <= status <= 599:
            raise ScenarioError(f"{scenario.text}: http needs a 4xx/5xx status")
        if ctx.broken:
            return _http_failure(ctx, status)
    reply = _plan_gen(ctx, clean=True)
    if not ctx.broken or scenario.mode == "http":
        return reply
    if scenario.mode == "stall-first-byte":
        reply.first_byte_delay = scenario.int_value() / 1000
    elif scenario.mode == "stall-after":
        reply.stall_after = (scenario.int_value(), ctx.seconds("ms", 1000))
    else:
        reply.drop_after = scenario.int_value()
    return reply


_HTTP_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request (simulated): 'messages' is not valid.", "invalid_request_error", "invalid_request"),
    401: ("Incorrect API key provided (simulated).", "invalid_request_error", "invalid_api_key"),
    403: ("Permission denied (simulated).", "permission_error", None),
    404: ("The model does not exist (simulated).", "invalid_request_error", "model_not_found"),
    429: ("Rate limit reached for requests (simulated).", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request (simulated).", "server_error", None),
    502: ("Bad gateway (simulated).", "server_error", None),
    503: ("The engine is currently overloaded, please try again later (simulated).", "server_error", "overloaded"),
}


def _http_failure(ctx: PlanContext, status: int) -> Reply:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    message, kind, code = _HTTP_ERRORS.get(status, (f"Simulated HTTP {status}.", kind, None))
    reply = error_reply(status, message, kind, code)
    if "retry-after" in ctx.scenario.options:
        seconds = ctx.scenario.get_float("retry-after", 0)
        reply.headers.append(("retry-after", f"{seconds:g}"))
    reply.fault = f"http-{status}"
    return _timed(reply, first_byte_delay=ctx.seconds("ttft", ctx.config.ttft_ms), frame_gap=0.0)


def _timed(reply: Reply, *, first_byte_delay: float, frame_gap: float) -> Reply:
    reply.first_byte_delay, reply.frame_gap = first_byte_delay, frame_gap
    return reply
