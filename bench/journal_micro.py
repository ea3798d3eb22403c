"""What one audit-journal append costs on the event loop: the chosen form against SQLite in WAL mode.

``.venv/bin/python bench/journal_micro.py [--records N]`` appends N typical records (a request start,
a guarded attempt with two findings, a request end: ~1.6 KB of JSON) three ways and prints
microseconds per record (median of 5 runs):

- ``file``: ``audit.journal.Journal.append`` (one ``os.write`` of an encoded line to an ``O_APPEND``
  file; fsync is the writer thread's, every 100 ms, and is not on this path);
- ``sqlite-wal``: one INSERT and COMMIT per record (``journal_mode=WAL``, ``synchronous=NORMAL``),
  the form that survives a process crash as the file does;
- ``sqlite-wal-shared``: the same with a connection shared with a reader thread draining it (what a
  SQLite journal would be next to its writer), contended for the GIL and SQLite's lock.

The figures are in docs/benchmarks.md ("The audit journal's form").
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audit.journal import Journal  # noqa: E402

RECORDS: list[dict[str, Any]] = [
    {"t": "start", "id": "1b3e4c0a-5f7d-4d1e-9a1b-2c3d4e5f6a7b", "req": {
        "tenant_id": 1, "api_key_id": 2, "route_id": 3, "upstream_id": 4, "client_protocol": "openai-chat",
        "client_user_agent": "OpenAI/Python 1.99", "model": "deepseek-chat", "upstream_model": "deepseek-chat",
        "path": "guarded", "created": 1.7e9, "fragments": "offending"}},
    {"t": "attempt", "id": "1b3e4c0a-5f7d-4d1e-9a1b-2c3d4e5f6a7b", "tenant_id": 1, "number": 0, "upstream_id": 4,
     "upstream_model": "deepseek-chat", "outcome": "retry", "upstream_status": 200,
     "abort_reason": "arguments can no longer become valid JSON", "ttfb_ms": 210.4, "duration_ms": 812.2,
     "prompt_tokens": 1200, "completion_tokens": 88, "bytes_received": 6412, "frames": 31, "created": 1.7e9,
     "findings": [{"kind": "arguments-not-json", "severity": "error", "action": "retry", "choice": 0, "slot": 0,
                   "frame": 17, "offset": 3120, "fragment": "data: {\"id\":\"chatcmpl-1\",\"choices\":[" * 4,
                   "detail": "arguments can no longer become valid JSON", "tool": "write_file"},
                  {"kind": "tool-call-id-missing", "severity": "info", "action": "normalized", "choice": 0,
                   "slot": 0, "frame": None, "offset": None, "fragment": "", "detail": "synthesized", "tool": ""}]},
    {"t": "finish", "id": "1b3e4c0a-5f7d-4d1e-9a1b-2c3d4e5f6a7b", "req": {"tenant_id": 1, "model": "x"},
     "res": {"outcome": "recovered-by-retry", "status": 200, "attempts": 2, "ttft_ms": 240.1, "total_ms": 1650.0,
             "prompt_tokens": 2400, "completion_tokens": 170, "wasted_completion_tokens": 88, "wasted_ms": 812.2,
             "error": "", "finished": 1.7e9}},
]


def per_record_us(append: Any, n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        append(RECORDS[i % 3])
    return (time.perf_counter() - started) / n * 1e6


def file_form(folder: Path, n: int) -> float:
    journal = Journal(folder / "file", max_bytes=1 << 40)
    try:
        return per_record_us(journal.append, n)
    finally:
        journal.close()


def sqlite_form(folder: Path, n: int, *, shared: bool) -> float:
    path = folder / f"journal-{time.monotonic_ns()}.sqlite3"
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute("pragma journal_mode=wal")
    db.execute("pragma synchronous=normal")
    db.execute("create table j (seq integer primary key, record text not null)")
    lock = threading.Lock()
    stop = threading.Event()

    def drain() -> None:  # a writer thread reading and deleting what it moved to the database
        while not stop.is_set():
            with lock:
                rows = db.execute("select seq from j order by seq limit 100").fetchall()
                if rows:
                    db.execute("delete from j where seq <= ?", (rows[-1][0],))
            time.sleep(0.01)

    reader = threading.Thread(target=drain) if shared else None
    if reader is not None:
        reader.start()

    def append(record: dict[str, Any]) -> None:
        text = json.dumps(record, separators=(",", ":"))
        with lock:
            db.execute("insert into j (record) values (?)", (text,))

    try:
        return per_record_us(append, n)
    finally:
        stop.set()
        if reader is not None:
            reader.join()
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=30_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="journal-micro-") as tmp:
        folder = Path(tmp)
        forms = {"file": lambda: file_form(folder, args.records),
                 "sqlite-wal": lambda: sqlite_form(folder, args.records, shared=False),
                 "sqlite-wal-shared": lambda: sqlite_form(folder, args.records, shared=True)}
        for name, run in forms.items():
            runs = [run() for _ in range(5)]
            print(f"{name:18s} {statistics.median(runs):7.2f} us/record   (runs: "
                  + ", ".join(f"{r:.2f}" for r in runs) + ")")


if __name__ == "__main__":
    main()
