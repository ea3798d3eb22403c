"""Command-line options shared by ``python -m proxy.simulator`` and ``manage.py simulate_upstream``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.simulator.faults import FAULTS
from proxy.simulator.server import serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the simulator's options on ``parser``."""
    parser.add_argument("--port", type=int, required=True, help="TCP port (0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--cases", default=None, help="fault-case fixtures directory")
    parser.add_argument("--corruption-rate", type=float, default=0.0, help="share of gen attempts corrupted (0..1)")
    parser.add_argument(
        "--kinds", default="", help=f"comma-separated fault kinds to draw from (default all {len(FAULTS)})"
    )
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first byte")
    parser.add_argument("--frame-ms", type=float, default=0.0, help="delay between SSE frames")
    parser.add_argument("--seed", type=int, default=0, help="seed for generated turns and faults")
    parser.add_argument(
        "--require-key", default=None, help="demand 'Authorization: Bearer KEY' ('*' = any non-empty key)"
    )
    parser.add_argument(
        "--reject-stream-options", action="store_true", help="answer 400 to requests with stream_options"
    )
    parser.add_argument("--stats-limit", type=int, default=10_000, help="request records kept")


def config_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`proxy.simulator.make_config` keywords from parsed options."""
    return {
        "cases_dir": options["cases"],
        "corruption_rate": options["corruption_rate"],
        "kinds": options["kinds"],
        "ttft_ms": options["ttft_ms"],
        "frame_ms": options["frame_ms"],
        "seed": options["seed"],
        "require_key": options["require_key"],
        "reject_stream_options": options["reject_stream_options"],
        "stats_limit": options["stats_limit"],
    }


def run(options: Mapping[str, Any], out: Any = sys.stdout) -> None:
    """Serve until interrupted; prints ``listening on http://HOST:PORT/v1`` once bound."""
    host = options["host"]

    def ready(port: int) -> None:
        out.write(f"toolrelay simulator listening on http://{host}:{port}/v1\n")
        out.flush()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, options["port"], ready=ready, **config_kwargs(options)))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m proxy.simulator``."""
    parser = argparse.ArgumentParser(prog="python -m proxy.simulator", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(vars(args))
    except ValueError as exc:
        parser.error(str(exc))
