"""Daphne under pyinstrument: ``python bench/profiled_daphne.py OUTPUT.txt <daphne arguments>``, or
toolrelay's launcher: ``python bench/profiled_daphne.py OUTPUT.txt serve <manage.py serve arguments>``.

Samples the event loop thread (where the byte path runs) from start to exit and writes pyinstrument's
text report to OUTPUT.txt when Daphne stops (SIGTERM). Used by ``bench/hotspots.py --profiler
pyinstrument``; needs ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from pyinstrument import Profiler


def _cprofile(output: Path, *, toolrelay: bool) -> None:
    """Deterministic profile of the event loop thread in CPU time (``time.thread_time``: waits cost
    nothing), written as the top functions by own time: what each piece of the byte path costs."""
    import cProfile
    import io
    import pstats
    import time

    profile = cProfile.Profile(time.thread_time)
    writer = cProfile.Profile(time.thread_time)  # the journal writer's thread, reported apart

    def profiled_cycle(self: Any) -> None:
        writer.enable()
        try:
            cycle(self)
        finally:
            writer.disable()

    if toolrelay:
        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        django.setup()
        from audit.journal_writer import JournalWriter

        cycle = JournalWriter._cycle
        JournalWriter._cycle = profiled_cycle  # type: ignore[method-assign]

    def write() -> None:
        profile.disable()
        text = io.StringIO()
        for title, which in (("event loop thread", profile), ("journal writer thread", writer)):
            text.write(f"===== {title}\n")
            with contextlib.suppress(TypeError):  # nothing recorded
                stats = pstats.Stats(which, stream=text)
                stats.sort_stats("tottime").print_stats(40)
                stats.sort_stats("cumulative").print_stats(50)
        output.write_text(text.getvalue())
        profile.dump_stats(str(output.with_suffix(".prof")))  # for pstats / snakeviz

    atexit.register(write)
    profile.enable()


def main() -> None:
    output = Path(sys.argv.pop(1))
    if os.environ.get("PROFILER") == "cprofile":
        _cprofile(output, toolrelay=sys.argv[1:2] == ["serve"])
    else:
        profiler = Profiler(interval=0.0005, async_mode="disabled")

        def write() -> None:
            profiler.stop()
            output.write_text(profiler.output_text(unicode=False, color=False, show_all=False))

        atexit.register(write)
        profiler.start()
    if sys.argv[1:2] == ["serve"]:
        from django.core.management import execute_from_command_line

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        execute_from_command_line(["manage.py", *sys.argv[1:]])
        return
    from daphne.cli import CommandLineInterface

    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
