#!/usr/bin/env python
"""Django's command-line utility for toolrelay."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from config.env import load_run_settings

    load_run_settings()  # printed URLs use the port `make run` serves on (var/run.env)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
