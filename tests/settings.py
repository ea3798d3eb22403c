"""The settings of the test run: ``config.settings``, read with none of toolrelay's variables from the
caller's shell, so the suite passes the same with an operator's ``UPSTREAM_ALLOW_NETWORKS``, ``REDIS_URL``,
``DEBUG`` ... exported. ``DATABASE_URL`` is kept: it chooses the run's database (Postgres in CI).

Selected by ``--ds`` in pyproject.toml's addopts (an option wins over an exported
``DJANGO_SETTINGS_MODULE``). pytest-django imports it before any conftest, so the environment is clean
before the settings are read; the processes the tests start (the e2e servers, workers) inherit the cleaned
environment plus what each fixture sets, and read ``config.settings`` themselves.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The product's packages (every top-level package but the tests' and the benchmarks'): every variable they
#: read by name is the caller's to leave out.
PACKAGES = tuple(sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name not in ("tests", "bench")))
#: ``envstr("NAME"`` / ``envint('NAME'`` ... and ``os.environ.get("NAME"`` / ``os.environ["NAME"]``.
_READ = re.compile(r"""(?:\benv[a-z]*\(\s*|os\.environ(?:\.get\(\s*|\[))["']([A-Z][A-Z0-9_]*)["']""")
#: Read by the test run on purpose (README: "Postgres when DATABASE_URL is set"); set by pytest-django.
KEPT = frozenset({"DATABASE_URL", "DJANGO_SETTINGS_MODULE"})
#: Read without a name literal: ``var/run.env``'s names (config/env.py) and scripts/run.sh's.
INDIRECT = frozenset({"SITE_URL", "PORT", "SIMULATOR_PORT"})


def operator_variables() -> frozenset[str]:
    """Every variable the product reads by name, with its ``NAME_FILE`` form, but :data:`KEPT`."""
    names = set(INDIRECT)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names.update(_READ.findall(path.read_text(encoding="utf-8")))
    return frozenset(names | {f"{name}_FILE" for name in names}) - KEPT


for _name in operator_variables():
    os.environ.pop(_name, None)
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"

from config.settings import *  # noqa: E402, F403
