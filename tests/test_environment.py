"""The suite does not depend on the caller's shell: toolrelay's variables exported by an operator are left
out of the test run (tests/settings.py), so `make test` passes the same with or without them."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from django.conf import settings

from tests.settings import operator_variables

ROOT = Path(__file__).resolve().parents[1]
#: What an operator running the product would have exported.
OPERATOR_SHELL = {
    "UPSTREAM_ALLOW_NETWORKS": "10.0.0.0/8",
    "REDIS_URL": "redis://127.0.0.1:1/0",
    "DEBUG": "0",
    "SECRET_KEY_FILE": "/nonexistent/secret",
    "MAX_PROXY_HOPS": "1",
    "SITE_URL": "https://proxy.example.com",
    "UPSTREAM_URL": "https://api.example.com/v1",
}


def test_the_run_reads_its_settings_through_the_cleaning_module() -> None:
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--ds=tests.settings" in addopts.split()
    assert set(OPERATOR_SHELL) <= operator_variables()
    assert "DATABASE_URL" not in operator_variables()
    assert not operator_variables() & os.environ.keys()
    assert settings.UPSTREAM_ALLOW_NETWORKS == []


def test_an_operators_exported_variables_do_not_reach_the_settings() -> None:
    probe = (
        "import tests.settings as s, os; "
        "print(s.UPSTREAM_ALLOW_NETWORKS, s.MAX_PROXY_HOPS, s.SITE_URL, 'UPSTREAM_URL' in os.environ, "
        "os.environ['DJANGO_SETTINGS_MODULE'])"
    )
    env = {**os.environ, **OPERATOR_SHELL, "DJANGO_SETTINGS_MODULE": "config.settings"}
    command = [sys.executable, "-c", probe]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    assert done.returncode == 0, done.stderr
    clean = {**os.environ}
    defaults = subprocess.run(command, cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    assert done.stdout == defaults.stdout
    assert done.stdout.split()[0] == "[]" and done.stdout.split()[-2:] == ["False", "config.settings"]
