"""The benchmark's load generator: a lean HTTP/1.1 streaming client in its own process.

``bench/run.py`` starts it once per phase: ``python bench/loadgen.py < job.json > records.json``.
It imports nothing from the project and no HTTP library: an ``asyncio.Protocol`` per keep-alive
connection parses the status line, headers and chunked body by hand, so the client costs far less
CPU per stream than the servers it measures (``run.py`` checks that by driving the simulator
directly at the same concurrency and reports that ceiling).

Every timestamp is ``time.monotonic()``, the same clock the simulator's ``/_sim/stats`` uses (on
Linux a system-wide ``CLOCK_MONOTONIC``), so client and upstream times can be subtracted.

Per request it records:

- ``ttft``: request written -> the first body read holding a non-empty text delta
  (``"content":"x`` / ``"reasoning_content":"x``), so a role-only first frame (which LiteLLM drops)
  or a keep-alive comment does not count as a token;
- ``gaps``: times between consecutive body reads from that first token on (paced frames arrive in
  reads of their own);
- ``end``: when the chunked terminator arrived; ``closed``: when the client hung up early
  (``close_after`` reads, the disconnect probe).

Job (JSON): ``{"targets": [{"host", "port", "path", "headers"}...], "requests": [{"body", "target",
"close_after", "pause"}...], "concurrency": N, "deadline": seconds, "timeout": seconds}``. Requests are
taken in order by ``concurrency`` workers until none is left or ``deadline`` passes; a target list
of several ports is used round-robin (``target`` = index, or -1 for round-robin); ``pause`` seconds
are waited before the request is sent (latency rounds: the previous request's background work, such
as LiteLLM's logging or toolrelay's audit write, ends before the next measurement starts).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

_TOKEN = re.compile(rb'"(?:content|reasoning_content)": ?"(?:[^"\\]|\\.)')
_OVERLAP = 64


@dataclass
class Record:
    """The timings of one request (seconds, ``time.monotonic()``; gaps in milliseconds)."""

    index: int
    target: int
    status: int = 0
    sent: float = 0.0
    first_byte: float | None = None
    token: float | None = None
    end: float | None = None
    closed: float | None = None
    gaps: list[float] = field(default_factory=list)
    bytes: int = 0
    reads: int = 0
    error: str = ""


class _Stream(asyncio.Protocol):
    """One keep-alive connection; ``request()`` sends a request and resolves when its answer ended."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self._done: asyncio.Future[None] | None = None
        self._rec: Record | None = None
        self._buf = bytearray()
        self._head = True
        self._chunked = False
        self._remaining = 0  # bytes left in the current chunk (or in a content-length body)
        self._skip = 0
        self._complete = False
        self._body_tail = b""
        self._last_read = 0.0
        self._close_after = 0
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.keep_alive = False
        if not self.lost.done():
            self.lost.set_result(None)
        self._finish("connection lost" if self._rec is not None and self._rec.end is None else "")

    def request(self, raw: bytes, rec: Record, close_after: int) -> asyncio.Future[None]:
        """Write ``raw`` and return a future that resolves when the response is complete."""
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._rec, self._buf, self._head, self._body_tail = rec, bytearray(), True, b""
        self._remaining, self._skip = 0, 0
        self._close_after = close_after
        rec.sent = time.monotonic()
        self.transport.write(raw)
        return self._done

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        rec = self._rec
        if rec is None:
            return
        self._buf += data
        if self._head:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self._parse_head(bytes(self._buf[:end]), rec)
            del self._buf[: end + 4]
            self._head = False
        if self._buf:
            self._body(now, rec)

    def _parse_head(self, head: bytes, rec: Record) -> None:
        lines = head.split(b"\r\n")
        rec.status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
        self._chunked = headers.get(b"transfer-encoding", b"").lower() == b"chunked"
        self._remaining = int(headers.get(b"content-length", b"0")) if not self._chunked else 0
        self.keep_alive = headers.get(b"connection", b"keep-alive").lower() != b"close"

    def _body(self, now: float, rec: Record) -> None:
        payload = self._decode()
        if payload:
            self._on_payload(payload, now, rec)
        if self._complete:
            rec.end = now
            self._finish("")
        elif self._close_after and rec.reads >= self._close_after and self.transport is not None:
            rec.closed = time.monotonic()
            self.keep_alive = False
            self.transport.close()
            self._finish("")

    def _decode(self) -> bytes:
        """Take the body bytes out of the buffer (de-chunked); sets ``_complete`` at the end."""
        self._complete = False
        buf = self._buf
        if not self._chunked:
            piece = bytes(buf[: self._remaining])
            del buf[: len(piece)]
            self._remaining -= len(piece)
            self._complete = self._remaining == 0
            return piece
        out = bytearray()
        while buf:
            if self._skip:  # the CRLF after a chunk's data
                dropped = min(self._skip, len(buf))
                del buf[:dropped]
                self._skip -= dropped
                continue
            if self._remaining == 0:
                line_end = buf.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(bytes(buf[:line_end]).split(b";")[0], 16)
                if size == 0:
                    if len(buf) < line_end + 4:
                        break  # wait for the final CRLF
                    del buf[: line_end + 4]
                    self._complete = True
                    break
                del buf[: line_end + 2]
                self._remaining = size
            take = min(self._remaining, len(buf))
            out += buf[:take]
            del buf[:take]
            self._remaining -= take
            if self._remaining == 0:
                self._skip = 2
        return bytes(out)

    def _on_payload(self, payload: bytes, now: float, rec: Record) -> None:
        rec.bytes += len(payload)
        rec.reads += 1
        if rec.first_byte is None:
            rec.first_byte = now
        if rec.token is None:
            window = self._body_tail + payload
            if _TOKEN.search(window):
                rec.token = now
                self._last_read = now
            self._body_tail = window[-_OVERLAP:]
            return
        rec.gaps.append((now - self._last_read) * 1000)
        self._last_read = now

    def _finish(self, error: str) -> None:
        if self._rec is not None and error and not self._rec.error:
            self._rec.error = error
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
        self._rec = None


class Client:
    """Keep-alive connections per target, reused by one worker at a time."""

    def __init__(self, targets: list[dict[str, Any]]) -> None:
        self.targets = targets
        self.idle: dict[int, list[_Stream]] = {i: [] for i in range(len(targets))}

    async def _connection(self, target: int) -> _Stream:
        pool = self.idle[target]
        while pool:
            conn = pool.pop()
            if conn.keep_alive and not conn.lost.done():
                return conn
        loop = asyncio.get_running_loop()
        spec = self.targets[target]
        _, proto = await loop.create_connection(_Stream, spec["host"], spec["port"])
        return proto

    async def run(self, rec: Record, body: bytes, close_after: int, limit: float) -> None:
        """Send one request and wait for its end (or ``limit`` seconds)."""
        spec = self.targets[rec.target]
        head = (f"POST {spec['path']} HTTP/1.1\r\nhost: {spec['host']}:{spec['port']}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in spec.get("headers", {}).items()) + "\r\n").encode()
        try:
            conn = await self._connection(rec.target)
        except OSError as exc:
            rec.error = f"connect: {exc}"
            return
        try:
            await asyncio.wait_for(conn.request(head + body, rec, close_after), limit)
        except TimeoutError:
            rec.error = rec.error or "timeout"
            if conn.transport is not None:
                conn.transport.abort()
            return
        if conn.keep_alive and rec.status and not rec.closed:
            self.idle[rec.target].append(conn)
        elif conn.transport is not None and not rec.closed:
            conn.transport.close()

    def close(self) -> None:
        for pool in self.idle.values():
            for conn in pool:
                if conn.transport is not None:
                    conn.transport.close()


async def run_job(job: dict[str, Any]) -> list[Record]:
    """Run every request of ``job`` (bounded by count and ``deadline``) and return their records."""
    client = Client(job["targets"])
    requests: list[dict[str, Any]] = job["requests"]
    records: list[Record] = []
    deadline = time.monotonic() + float(job.get("deadline", 60))
    timeout = float(job.get("timeout", 30))
    position = 0
    rr = 0

    async def worker() -> None:
        nonlocal position, rr
        while position < len(requests) and time.monotonic() < deadline:
            spec = requests[position]
            target = spec.get("target", -1)
            if target < 0:
                target, rr = rr % len(client.targets), rr + 1
            rec = Record(index=position, target=target)
            position += 1
            records.append(rec)
            body = json.dumps(spec["body"]).encode()
            if spec.get("pause"):
                await asyncio.sleep(float(spec["pause"]))  # let the previous request's background work settle
            await client.run(rec, body, int(spec.get("close_after", 0)), min(timeout, deadline - time.monotonic() + 5))

    await asyncio.gather(*(worker() for _ in range(int(job.get("concurrency", 1)))))
    client.close()
    await asyncio.sleep(0.05)  # let closes reach the servers
    return records


def main() -> None:
    job = json.load(sys.stdin)
    started = time.monotonic()
    cpu0 = time.process_time()
    records = asyncio.run(run_job(job))
    json.dump({"records": [asdict(r) for r in records], "wall": time.monotonic() - started,
               "cpu": time.process_time() - cpu0}, sys.stdout)


if __name__ == "__main__":
    main()
