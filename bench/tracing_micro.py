"""What tracing costs one clean guarded request in this process, on the event loop and in the export thread
(issue 22's budget: at most +10% CPU per request, +0.3 ms TTFT p50).

``.venv/bin/python bench/tracing_micro.py [--requests N]`` prints CPU microseconds per request (the least of 7
runs of N: on a shared machine the least is the one least disturbed) of:

- ``hooks``: every hook the edge and the relay call for one request with one attempt (``start_request``,
  ``routed``, the attempt span with its turn and journaled call, ``relayed``, ``end``) on a tracer whose
  processor only keeps the ended spans (the event loop's share);
- ``encode``: the OTLP protobuf encoding of that request's spans (``encode_spans``, what the export thread
  does per batch, per request);
- ``off``: the same hooks with tracing off (the recorder's floor).

No server, no collector: the share of tracing that is toolrelay's own code and the SDK's calls it makes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from audit.records import AttemptRecord  # noqa: E402
from proxy.guard.turn import ChoiceTurn, Turn  # noqa: E402
from proxy.telemetry import spans, tracing  # noqa: E402

TARGET = SimpleNamespace(base_url="http://127.0.0.1:9100/v1", model="bench-model", name="bench-upstream")
CALL = SimpleNamespace(request=SimpleNamespace(model="bench-model", stream=True), path="guarded",
                       protocol="openai-chat", principal=SimpleNamespace(slug="bench"),
                       plan=SimpleNamespace(route_name="", policy=SimpleNamespace(trace_content=False)))
SCOPE = {"method": "POST", "path": "/v1/chat/completions", "headers": [(b"user-agent", b"bench")]}


class Keep(SpanExporter):
    """Keeps the spans handed over (the processor's queue stands in for the export thread)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def one() -> None:
    turn = Turn(id="chatcmpl-1", model="bench-model", choices=[ChoiceTurn(index=0, finish_reason="tool_calls")],
                usage={"prompt_tokens": 11, "completion_tokens": 7})
    record = AttemptRecord(number=0, upstream_id=1, upstream_model="bench-model", outcome="clean",
                           upstream_status=200, ttfb_ms=1.2, duration_ms=9.0, prompt_tokens=11,
                           completion_tokens=7, bytes_received=2000, frames=20, cost_usd=0.000025)
    trace = spans.start_request(SCOPE, request_id="r-1", route="/v1/chat/completions")
    trace.routed(CALL)
    with trace.attempt(0, TARGET) as attempt:  # type: ignore[arg-type]
        trace.call_recorded(TARGET, record)  # type: ignore[arg-type]
        attempt.ended(SimpleNamespace(decision=SimpleNamespace(turn=turn)))
    trace.relayed(outcome="clean", attempts=1, ttft=0.002)
    trace.end(200)


def per_request(requests: int) -> float:
    runs = []
    for _ in range(7):
        start = time.process_time()
        for _ in range(requests):
            one()
        runs.append((time.process_time() - start) / requests * 1e6)
    return min(runs)


async def main(requests: int) -> None:
    keep = Keep()
    tracing.setup(exporter=keep, force=True)
    processor = tracing.provider()._active_span_processor._span_processors[0]  # type: ignore[union-attr]  # noqa: SLF001
    processor.batch.on_end = lambda span: keep.spans.append(span)  # no export thread: the queue's share only
    one()
    hooks = per_request(requests)
    batch = keep.spans[-2 * requests:]
    runs = []
    for _ in range(7):
        start = time.process_time()
        encode_spans(batch).SerializeToString()
        runs.append((time.process_time() - start) / requests * 1e6)
    encode = min(runs)
    attrs = statistics.mean(len(s.attributes or {}) for s in batch)
    tracing.reset()
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    tracing.setup(force=True)
    off = per_request(requests)
    print(f"spans per request {len(batch) / requests:.0f}, attributes per span {attrs:.1f}")
    for label, us in (("hooks (tracing on)", hooks), ("encode (export thread)", encode), ("hooks (tracing off)", off)):
        print(f"{label:28s} {us:8.1f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    asyncio.run(main(parser.parse_args().requests))
