"""Micro-benchmark of the guarded byte path: SSE decode + accumulate (``AttemptGuard``) + emit.

Run from the repository root: ``.venv/bin/python bench/guard_micro.py [--runs N]``.

Scenarios (each frame is fed to the guard as its own network chunk):

- ``tool-call-4k``: one 4 KB tool call whose arguments arrive in ~200 deltas;
- ``text-2000``: a 2,000-token text stream, one token per frame (guarded: the request has tools);
- ``text-2000-marks``: the same with tokens full of the characters markers start with (``<``, ``[``,
  ``:``, ``=``, a trailing ``to``), the worst case for the dialect scan's first-character filter.

Each scenario is timed twice: the whole guarded path (``AttemptGuard.feed`` + the OpenAI emitter)
and ``feed`` alone (``--feed`` rows), the per-frame cost the dialect library adds to.

The baseline, measured in the same run over the same frames, is what any re-framing proxy must do
at least: ``json.loads`` + ``json.dumps`` per frame. Times are the median of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from the repo root

from proxy.guard.decisions.attempt import AttemptGuard  # noqa: E402 -- needs the path set above
from proxy.guard.events import Done, TextDelta  # noqa: E402
from proxy.guard.policy import GuardPolicy  # noqa: E402
from proxy.guard.protocols.emit_openai import OpenAIChatEmitter  # noqa: E402
from proxy.guard.turn import RequestSpec, ToolSpec  # noqa: E402

ENVELOPE = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000,
            "model": "bench-model"}
SPEC = RequestSpec(tools=(ToolSpec("write_file", {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"]}),))


def frame(delta: dict[str, object], finish: str | None = None) -> bytes:
    """One upstream SSE event carrying ``delta`` for choice 0."""
    chunk = {**ENVELOPE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def tool_call_frames(size: int = 4096, deltas: int = 200) -> list[bytes]:
    """A ``size``-byte write_file call streamed in ``deltas`` argument fragments."""
    body = json.dumps({"path": "docs/out.txt", "content": "x" * (size - 40)}, separators=(",", ":"))
    step = -(-len(body) // deltas)
    header = {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                   "function": {"name": "write_file", "arguments": ""}}]}
    frames = [frame(header)]
    for start in range(0, len(body), step):
        frames.append(frame({"tool_calls": [{"index": 0, "function": {"arguments": body[start : start + step]}}]}))
    return [*frames, frame({}, "tool_calls"), b"data: [DONE]\n\n"]


def text_frames(tokens: int = 2000) -> list[bytes]:
    """A text answer of ``tokens`` frames, one short token each."""
    frames = [frame({"role": "assistant", "content": ""})]
    frames += [frame({"content": f" tok{i % 97}"}) for i in range(tokens)]
    return [*frames, frame({}, "stop"), b"data: [DONE]\n\n"]


def marked_text_frames(tokens: int = 2000) -> list[bytes]:
    """Text tokens that keep hitting marker first characters without being markers."""
    words = [" a<b", " x[1]", " key:", " v=2", " to", " the", " {ok}", " </p>", " call", " 3>2"]
    frames = [frame({"role": "assistant", "content": ""})]
    frames += [frame({"content": words[i % len(words)]}) for i in range(tokens)]
    return [*frames, frame({}, "stop"), b"data: [DONE]\n\n"]


def feed_only(frames: list[bytes]) -> int:
    """``AttemptGuard.feed`` per frame and ``finish``: the guard's own cost."""
    guard = AttemptGuard(SPEC, GuardPolicy())
    out = 0
    for data in frames:
        out += len(guard.feed(data))
    return out + len(guard.finish())


def guarded(frames: list[bytes]) -> int:
    """Decode, accumulate and emit ``frames``; return the bytes emitted (to keep the work observable)."""
    guard = AttemptGuard(SPEC, GuardPolicy())
    emitter = OpenAIChatEmitter(model="bench-model", include_usage=False, completion_id="chatcmpl-bench",
                                created=1700000000)
    out = 0
    for data in frames:
        out += _emit(emitter, guard.feed(data))
    final = guard.finish()
    out += _emit(emitter, final)
    done = next(e for e in final if isinstance(e, Done))
    if done.decision.turn is None:
        raise SystemExit(f"guard rejected the benchmark stream: {done.decision.reason}")
    return out + len(emitter.close(done.decision.turn))


def _emit(emitter: OpenAIChatEmitter, events: list[object]) -> int:
    """Emit the live text deltas among ``events``; return the byte count."""
    return sum(len(emitter.text(e.choice, e.channel, e.text)) for e in events if isinstance(e, TextDelta))


def baseline(frames: list[bytes]) -> int:
    """The floor: parse and re-serialise every data frame."""
    out = 0
    for data in frames:
        payload = data[6:-2]
        if payload != b"[DONE]":
            out += len(json.dumps(json.loads(payload), separators=(",", ":")))
    return out


def median_seconds(work: Callable[[list[bytes]], int], frames: list[bytes], runs: int) -> float:
    """Median wall time of ``runs`` runs of ``work(frames)`` (one warm-up run first)."""
    work(frames)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work(frames)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def row(name: str, frames: int, seconds: float) -> str:
    """One table row: per-frame µs, total ms, frames/s."""
    return f"{name:<26}{frames:>7}{seconds / frames * 1e6:>12.2f}{seconds * 1e3:>11.2f}{frames / seconds:>13,.0f}"


def main() -> None:
    """Run both scenarios and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    print(f"{'scenario':<26}{'frames':>7}{'us/frame':>12}{'total ms':>11}{'frames/s':>13}")
    ratios = []
    scenarios = (("tool-call-4k", tool_call_frames()), ("text-2000", text_frames()),
                 ("text-2000-marks", marked_text_frames()))
    for name, frames in scenarios:
        guard_s = median_seconds(guarded, frames, runs)
        feed_s = median_seconds(feed_only, frames, runs)
        base_s = median_seconds(baseline, frames, runs)
        print(row(f"{name} guard", len(frames), guard_s))
        print(row(f"{name} --feed", len(frames), feed_s))
        print(row(f"{name} baseline", len(frames), base_s))
        ratios.append((name, guard_s / base_s))
    for name, ratio in ratios:
        print(f"{name}: guard / baseline = {ratio:.1f}x")


if __name__ == "__main__":
    main()
