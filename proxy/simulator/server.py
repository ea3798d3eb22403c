"""The simulator's HTTP server: routes, auth, attempt counters, stats and paced writing.

Plain ``asyncio.start_server`` plus :mod:`proxy.simulator.httpio` (no framework, no Django), one
task per connection, keep-alive, chunked SSE bodies. Everything runs on one event loop; the stats
are only touched from it (the thread starter hops onto the loop to read them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import hmac
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.simulator import faults
from proxy.simulator.cases import CaseLibrary, CaseNotFound, default_cases_dir
from proxy.simulator.httpio import LAST_CHUNK, BadRequest, Connection, Request, chunk, head
from proxy.simulator.planner import JSON, PlanContext, Reply, SimConfig, error_reply, plan
from proxy.simulator.scenario import Scenario, ScenarioError, parse_scenario

_COMPLETIONS = ("/v1/chat/completions", "/chat/completions")
_MODELS = ("/v1/models", "/models")
_SECRET_HEADERS = ("authorization", "x-api-key", "api-key")
#: Unpaced frames go out in writes of about this many bytes: one syscall for a short stream, and a
#: long one shows its progress in ``bytes_sent`` (and waits in ``drain`` for a slow reader) as it goes.
BATCH_BYTES = 64 * 1024


def make_config(
    *,
    cases_dir: str | Path | None = None,
    corruption_rate: float = 0.0,
    kinds: str | Sequence[str] | None = None,
    ttft_ms: float = 0.0,
    frame_ms: float = 0.0,
    seed: int = 0,
    require_key: str | None = None,
    reject_stream_options: bool = False,
    stats_limit: int = 10_000,
) -> SimConfig:
    """A validated :class:`SimConfig` (``kinds`` as ``"a,b"`` or a list; empty means all kinds).

    Raises ``ValueError`` for an unknown kind or a rate outside 0..1.
    """
    if not 0.0 <= corruption_rate <= 1.0:
        raise ValueError("corruption_rate must be between 0 and 1")
    return SimConfig(
        cases_dir=Path(cases_dir) if cases_dir else default_cases_dir(),
        corruption_rate=corruption_rate,
        kinds=faults.parse_kinds(kinds),
        ttft_ms=ttft_ms,
        frame_ms=frame_ms,
        seed=seed,
        require_key=require_key or None,
        reject_stream_options=reject_stream_options,
        stats_limit=stats_limit,
    )


class Stats:
    """Per-request records (newest last, capped) and per-(scenario, messages) attempt counters."""

    def __init__(self, limit: int) -> None:
        self.records: deque[dict[str, Any]] = deque(maxlen=limit)
        self.attempts: dict[str, int] = {}
        self._next_id = 0

    def next_attempt(self, key: str) -> int:
        """Count one more attempt of ``key``; returns its 1-based number."""
        self.attempts[key] = self.attempts.get(key, 0) + 1
        return self.attempts[key]

    def open(self, request: Request, connection: int) -> dict[str, Any]:
        """Start the record of ``request`` (filled in while it is answered)."""
        self._next_id += 1
        token = _bearer(request.headers)
        record: dict[str, Any] = {
            "id": self._next_id,
            "connection": connection,
            "method": request.method,
            "path": request.path,
            "headers": {k: ("[redacted]" if k in _SECRET_HEADERS else v) for k, v in request.headers.items()},
            "authorization_present": "authorization" in request.headers,
            "authorization_sha256": hashlib.sha256(token.encode()).hexdigest()[:16] if token else None,
            "scenario": None, "mode": None, "counter_key": None, "attempt": None,
            "stream": None, "fault": None, "status": None, "body": None,
            "started_monotonic": time.monotonic(), "started_time": time.time(),
            "first_byte_monotonic": None, "ended_monotonic": None, "ended_time": None,
            "frames_sent": 0, "bytes_sent": 0, "completed": False,
            "client_closed_at": None, "client_closed_time": None,
        }  # fmt: skip
        self.records.append(record)
        return record

    def snapshot(self) -> dict[str, Any]:
        """A JSON-safe copy: ``{"requests": [...], "counters": {key: attempts}}``."""
        copy: dict[str, Any] = json.loads(json.dumps({"requests": list(self.records), "counters": self.attempts},
                                                     default=str))
        return copy

    def reset(self) -> None:
        """Forget every record and counter."""
        self.records.clear()
        self.attempts.clear()


def _bearer(headers: Mapping[str, str]) -> str:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _messages_digest(body: dict[str, Any]) -> str:
    canonical = json.dumps(body.get("messages"), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class Simulator:
    """A fault-injecting OpenAI-compatible upstream on one event loop."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats = Stats(config.stats_limit)
        self.library = CaseLibrary(config.cases_dir)
        self._server: asyncio.Server | None = None
        self._open: dict[Connection, asyncio.Task[Any]] = {}
        self._connections = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 = any free port); returns the bound port."""
        self._server = await asyncio.start_server(self._on_connection, host, port, backlog=1024)
        return int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        """Stop listening and close every open connection."""
        if self._server is not None:
            self._server.close()
        # Closing the transports lets each handler see EOF / a gone client and finish on its own;
        # cancelling them instead makes asyncio's stream callback log the CancelledError.
        for conn in list(self._open):
            conn.writer.transport.abort()
        if self._open:
            await asyncio.wait(set(self._open.values()), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        conn = Connection(reader, writer, self._connections)
        task = asyncio.current_task()
        if task is not None:
            self._open[conn] = task
        try:
            while await self._serve_one(conn):
                pass
        except (ConnectionError, OSError):
            pass  # the client went away between requests
        finally:
            await conn.close()
            self._open.pop(conn, None)

    async def _serve_one(self, conn: Connection) -> bool:
        """Answer one request; False when the connection must close."""
        try:
            request = await conn.read_request()
        except BadRequest as exc:
            await conn.send(_fixed(error_reply(400, str(exc), "invalid_request_error"), keep_alive=False))
            return False
        if request is None:
            return False
        if request.path.startswith("/_sim/"):
            return await self._control(conn, request)
        record = self.stats.open(request, conn.number)
        reply = self._answer(request, record)
        record["status"], record["fault"] = reply.status, reply.fault
        return await self._send(conn, request, reply, record)

    def _answer(self, request: Request, record: dict[str, Any]) -> Reply:
        if request.path not in _COMPLETIONS + _MODELS:
            return error_reply(404, f"Unknown path {request.path}", "invalid_request_error", "not_found")
        if request.body:
            # Recorded before the auth check: tests look at what a rejected request carried.
            with contextlib.suppress(UnicodeDecodeError, json.JSONDecodeError):
                record["body"] = json.loads(request.body)
        if not self._authorized(request):
            message = "Incorrect API key provided (simulator)."
            return error_reply(401, message, "invalid_request_error", "invalid_api_key")
        if request.path in _MODELS:
            if request.method != "GET":
                return error_reply(405, "Use GET.", "invalid_request_error")
            return Reply(200, JSON, [json.dumps(self._models()).encode()], streamed=False)
        if request.method != "POST":
            return error_reply(405, "Use POST.", "invalid_request_error")
        return self._completion(request, record)

    def _authorized(self, request: Request) -> bool:
        wanted = self.config.require_key
        if wanted is None:
            return True
        token = _bearer(request.headers)
        return bool(token) and (wanted == "*" or hmac.compare_digest(token.encode(), wanted.encode()))

    def _completion(self, request: Request, record: dict[str, Any]) -> Reply:
        body = record["body"]
        if not isinstance(body, dict):
            return error_reply(400, "The request body must be a JSON object.", "invalid_request_error")
        record["stream"] = bool(body.get("stream"))
        if self.config.reject_stream_options and "stream_options" in body:
            message = "Unrecognized request argument supplied: stream_options"
            return error_reply(400, message, "invalid_request_error", param="stream_options")
        model = body.get("model") if isinstance(body.get("model"), str) else ""
        selector = request.headers.get("x-sim-scenario") or model or "gen"
        try:
            scenario = parse_scenario(selector) or Scenario(text=selector, mode="gen")
            digest = _messages_digest(body)
            key = f"{scenario.text}#{digest[:16]}"
            attempt = self.stats.next_attempt(key)
            record.update(scenario=scenario.text, mode=scenario.mode, counter_key=key, attempt=attempt)
            return plan(PlanContext(body, scenario, attempt, digest, self.config, self.library))
        except (ScenarioError, CaseNotFound) as exc:
            return error_reply(400, f"simulator scenario: {exc}", "invalid_request_error", "bad_scenario")

    def _models(self) -> dict[str, Any]:
        names = ["gen", "gen:reasoning=1", "text:30", "slow:50", *(f"case:{c}" for c in self.library.ids())]
        created = int(time.time())
        models = [{"id": n, "object": "model", "created": created, "owned_by": "toolrelay-simulator"} for n in names]
        return {"object": "list", "data": models}

    async def _control(self, conn: Connection, request: Request) -> bool:
        """``GET /_sim/stats`` and ``POST /_sim/reset``."""
        if request.path == "/_sim/stats" and request.method == "GET":
            reply = Reply(200, JSON, [json.dumps(self.stats.snapshot()).encode()], streamed=False)
        elif request.path == "/_sim/reset" and request.method == "POST":
            self.stats.reset()
            reply = Reply(200, JSON, [b'{"reset":true}'], streamed=False)
        else:
            reply = error_reply(404, f"Unknown control path {request.path}", "invalid_request_error")
        return await conn.send(_fixed(reply, keep_alive=request.keep_alive)) and request.keep_alive

    async def _send(self, conn: Connection, request: Request, reply: Reply, record: dict[str, Any]) -> bool:
        """Write ``reply`` with its timing; True when the connection can serve another request."""
        conn.watch()
        try:
            finished = await _write(conn, reply, record, keep_alive=request.keep_alive)
        finally:
            await conn.unwatch()
            record["ended_monotonic"], record["ended_time"] = time.monotonic(), time.time()
            if conn.closed_at is not None and not record["completed"]:
                record["client_closed_at"] = conn.closed_at
                record["client_closed_time"] = time.time() - (time.monotonic() - conn.closed_at)
        return finished and request.keep_alive


def _headers(reply: Reply, *, keep_alive: bool) -> list[tuple[str, str]]:
    headers = [("content-type", reply.content_type), ("server", "toolrelay-simulator")]
    if reply.streamed:
        headers += [("transfer-encoding", "chunked"), ("cache-control", "no-cache")]
    else:
        headers.append(("content-length", str(sum(len(p) for p in reply.pieces))))
    if reply.fault:
        headers.append(("x-sim-fault", reply.fault))
    return [*headers, *reply.headers, ("connection", "keep-alive" if keep_alive else "close")]


def _fixed(reply: Reply, *, keep_alive: bool) -> bytes:
    return head(reply.status, _headers(reply, keep_alive=keep_alive)) + b"".join(reply.pieces)


async def _write(conn: Connection, reply: Reply, record: dict[str, Any], *, keep_alive: bool) -> bool:
    """Write ``reply`` paced as planned; False if the client left or the plan drops the connection."""
    start = time.monotonic() + reply.first_byte_delay
    if not await conn.pause_until(start):
        return False
    if not reply.streamed:
        return await _write_fixed(conn, reply, record, keep_alive=keep_alive)
    out = _Batch(conn, record, head(reply.status, _headers(reply, keep_alive=keep_alive)))
    due = start
    for number, piece in enumerate(reply.pieces):
        if number == reply.drop_after:
            break
        due += (reply.frame_gap if number else 0.0) + _stall(reply, number)
        if due > time.monotonic() and not (await out.flush() and await conn.pause_until(due)):
            return False
        out.add(piece)
        if len(out.data) >= BATCH_BYTES and not await out.flush():
            return False
    if reply.drop_after is not None:
        await out.flush()
        conn.drop()
        return False
    record["completed"] = await out.flush(LAST_CHUNK)
    return bool(record["completed"])


class _Batch:
    """Frames due at the same moment go out in one write of up to ``BATCH_BYTES`` (one syscall, not
    one per frame), which keeps unpaced benchmark streams cheap; paced frames are flushed one by one
    as they fall due."""

    def __init__(self, conn: Connection, record: dict[str, Any], first: bytes) -> None:
        self.conn, self.record = conn, record
        self.data, self.frames, self.size = bytearray(first), 0, 0

    def add(self, piece: bytes) -> None:
        self.data += chunk(piece)
        self.frames += 1
        self.size += len(piece)

    async def flush(self, tail: bytes = b"") -> bool:
        """Write what is pending (plus ``tail``); False if the client is gone."""
        self.data += tail
        if not self.data:
            return not self.conn.gone()
        if not await self.conn.send(bytes(self.data)):
            return False
        if self.record["first_byte_monotonic"] is None:
            self.record["first_byte_monotonic"] = time.monotonic()
        self.record["frames_sent"] += self.frames
        self.record["bytes_sent"] += self.size
        self.data, self.frames, self.size = bytearray(), 0, 0
        return not self.conn.gone()


def _stall(reply: Reply, number: int) -> float:
    """Seconds to pause before frame ``number`` (``stall-after=K:ms=MS``), else 0."""
    if reply.stall_after is None or number != reply.stall_after[0]:
        return 0.0
    return reply.stall_after[1]


async def _write_fixed(conn: Connection, reply: Reply, record: dict[str, Any], *, keep_alive: bool) -> bool:
    """A Content-Length answer; under ``drop_after`` only half the body goes out."""
    data = _fixed(reply, keep_alive=keep_alive)
    body = b"".join(reply.pieces)
    if reply.drop_after is not None:
        data = data[: len(data) - len(body) // 2]
    if not await conn.send(data):
        return False
    record["first_byte_monotonic"] = time.monotonic()
    record["frames_sent"], record["bytes_sent"] = 1, len(body)
    if reply.drop_after is not None:
        conn.drop()
        return False
    record["completed"] = True
    return True


async def serve(
    host: str = "127.0.0.1", port: int = 8001, *, ready: Callable[[int], None] | None = None, **defaults: Any
) -> None:
    """Run a simulator until cancelled; ``ready(port)`` is called once it listens.

    ``defaults`` are :func:`make_config` keywords (``corruption_rate``, ``kinds``, ``ttft_ms``, …).
    """
    simulator = Simulator(make_config(**defaults))
    bound = await simulator.start(host, port)
    if ready is not None:
        ready(bound)
    try:
        await asyncio.Event().wait()
    finally:
        await simulator.aclose()


@dataclass(frozen=True)
class RunningSimulator:
    """A simulator serving from its own event loop in a daemon thread (tests, benchmarks)."""

    host: str
    port: int
    simulator: Simulator
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def url(self) -> str:
        """The OpenAI base URL, ``http://host:port/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        """``{"requests": [record, ...], "counters": {...}}``, as ``GET /_sim/stats`` returns."""
        snapshot: dict[str, Any] = self._call(self.simulator.stats.snapshot)
        return snapshot

    def reset(self) -> None:
        """Clear records and attempt counters, as ``POST /_sim/reset`` does."""
        self._call(self.simulator.stats.reset)

    def stop(self) -> None:
        """Close every connection, stop the loop and join the thread (idempotent)."""
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self.simulator.aclose(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    def _call(self, function: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def __enter__(self) -> RunningSimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(host: str = "127.0.0.1", port: int = 0, **defaults: Any) -> RunningSimulator:
    """Start a simulator on ``host:port`` (0 = a free port) in a daemon thread and return it.

    ``defaults`` are :func:`make_config` keywords. Use as a context manager or call ``stop()``.
    """
    simulator = Simulator(make_config(**defaults))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="toolrelay-simulator", daemon=True)
    thread.start()
    future: concurrent.futures.Future[int] = asyncio.run_coroutine_threadsafe(simulator.start(host, port), loop)
    try:
        bound = future.result(timeout=10)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        raise
    return RunningSimulator(host, bound, simulator, loop, thread)
