"""Daphne under pyinstrument: ``python bench/profiled_daphne.py OUTPUT.txt <daphne arguments>``, or
toolrelay's launcher: ``python bench/profiled_daphne.py OUTPUT.txt serve <manage.py serve arguments>``.

Samples the event loop thread (where the byte path runs) from start to exit and writes pyinstrument's
text report to OUTPUT.txt when Daphne stops (SIGTERM). Used by ``bench/hotspots.py --profiler
pyinstrument``; needs ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path

from pyinstrument import Profiler


def main() -> None:
    output = Path(sys.argv.pop(1))
    profiler = Profiler(interval=0.0005, async_mode="disabled")

    def write() -> None:
        profiler.stop()
        output.write_text(profiler.output_text(unicode=False, color=False, show_all=False))

    atexit.register(write)
    profiler.start()
    if sys.argv[1:2] == ["serve"]:
        import os

        from django.core.management import execute_from_command_line

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        execute_from_command_line(["manage.py", *sys.argv[1:]])
        return
    from daphne.cli import CommandLineInterface

    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
