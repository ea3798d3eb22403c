"""What the pass-through side checks cost per request: ``PassCheck`` over a typical 21-frame stream.

``.venv/bin/python bench/passcheck_micro.py [--runs N]`` feeds a tool-less stream (19 content deltas,
a finish chunk, a usage chunk, ``[DONE]``; one network chunk per frame, as upstreams send them) through
``proxy.guard.checks.passcheck.PassCheck`` with one upstream secret to look for, and prints the microseconds
per stream (best of N runs of 2,000 streams each: the box's other load only ever adds). The baseline is
``json.loads`` of every frame alone, the least a check that a frame is JSON can cost. Budget (issue 11):
<= 150 us per 21-frame request.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.guard.checks.passcheck import PassCheck  # noqa: E402


def stream() -> list[bytes]:
    """The frames of a typical pass-through answer, each as the upstream's own chunk."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "deepseek-chat"}
    frames = [{**head, "choices": [{"index": 0, "delta": {"content": f"word{i} "}, "finish_reason": None}]}
              for i in range(19)]
    frames.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    frames.append({**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25}})
    return [b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames] + [b"data: [DONE]\n\n"]


def best_us(work: object, chunks: list[bytes], runs: int, streams: int = 2000) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(streams):
            work(chunks)  # type: ignore[operator]
        best = min(best, (time.perf_counter() - started) / streams)
    return best * 1e6


def side_checks(chunks: list[bytes]) -> None:
    check = PassCheck(secrets=("sk-upstream-secret-0123456789",))
    for chunk in chunks:
        check.feed(chunk)
    check.finish()


def loads_only(chunks: list[bytes]) -> None:
    for chunk in chunks:
        if not chunk.startswith(b"data: [DONE]"):
            json.loads(chunk[6:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    chunks = stream()
    checks, base = best_us(side_checks, chunks, args.runs), best_us(loads_only, chunks, args.runs)
    print(f"PassCheck per {len(chunks) - 1}-frame stream: {checks:.1f} us (json.loads alone: {base:.1f} us; "
          f"budget 150 us)")


if __name__ == "__main__":
    main()
