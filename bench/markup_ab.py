"""In-process A/B of the leaked-markup scanner: the same ``AttemptGuard.feed`` with two scanners.

Run from the repository root, with a checkout of the commit to compare against (``git worktree add``
or ``git archive REV | tar -x -C DIR``)::

    .venv/bin/python bench/markup_ab.py --before /tmp/tr-main [--rounds 15]

The guard of this tree is timed with its own ``MarkupScanner`` and with the one from
``DIR/proxy/guard/markup.py`` swapped in, alternately in one process (the rest of the guard is the
same code), on the frames of ``bench/guard_micro.py``. The minimum over the rounds is reported:
on a shared machine the least-disturbed run is the closest to the code's own cost.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from the repo root

import guard_micro  # noqa: E402 -- needs the path set above

from proxy.guard.decisions import attempt  # noqa: E402


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("markup_before", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["markup_before"] = module
    spec.loader.exec_module(module)
    return module


def _per_frame(frames: list[bytes], scanner: type, repeat: int = 3) -> float:
    """Microseconds per frame of ``feed_only`` with ``scanner`` in the guard (best of ``repeat``)."""
    attempt.MarkupScanner = scanner  # type: ignore[misc]  # the one seam this benchmark varies
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        guard_micro.feed_only(frames)
        best = min(best, time.perf_counter() - start)
    return best / len(frames) * 1e6


def main() -> None:
    """Alternate the two scanners over the scenarios and print the best per-frame times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the commit to compare against")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    before, after = _load(args.before / "proxy" / "guard" / "markup.py").MarkupScanner, attempt.MarkupScanner
    scenarios = (("tool-call-4k", guard_micro.tool_call_frames()), ("text-2000", guard_micro.text_frames()),
                 ("text-2000-marks", guard_micro.marked_text_frames()))
    print(f"{'scenario (feed only)':<24}{'before us/frame':>17}{'after us/frame':>16}{'change':>9}")
    for name, frames in scenarios:
        b = min(_per_frame(frames, before) for _ in range(args.rounds))
        a = min(_per_frame(frames, after) for _ in range(args.rounds))
        print(f"{name:<24}{b:>17.2f}{a:>16.2f}{(a / b - 1) * 100:>+8.1f}%")
    attempt.MarkupScanner = after  # type: ignore[misc]


if __name__ == "__main__":
    main()
