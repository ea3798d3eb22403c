"""``make audit-deps`` (scripts/audit_deps.py) fails when it could not check (issue 24 item 13): it
skipped every package when the advisory source was unreachable and exited 0, a check that cannot fail.
pip-audit is the seam (``audit``); the verdicts and exit codes are the script's own."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("audit_deps", ROOT / "scripts" / "audit_deps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DEP = {"name": "django", "version": "5.2", "vulns": []}
SKIPPED = {"name": "httpx", "version": "0.28", "skip_reason": "could not be looked up"}


@pytest.mark.parametrize("answer", [
    (1, None, "ConnectionError: advisory service unreachable"),
    (0, {"dependencies": [SKIPPED, SKIPPED]}, ""),
    (0, {"dependencies": [DEP, SKIPPED]}, ""),
])
def test_a_run_that_could_not_check_fails_saying_so(answer: Any, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    script = _script()
    monkeypatch.setattr(script, "audit", lambda lock: answer)
    monkeypatch.delenv("AUDIT_DEPS_ALLOW_UNCHECKED", raising=False)
    assert script.verdict("requirements/runtime.txt") == script.NOT_CHECKED
    assert "NOT CHECKED" in capsys.readouterr().out
    monkeypatch.setenv("AUDIT_DEPS_ALLOW_UNCHECKED", "1")
    assert script.verdict("requirements/runtime.txt") == 0


def test_a_full_check_passes_and_a_vulnerability_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script()
    monkeypatch.setattr(script, "audit", lambda lock: (0, {"dependencies": [DEP]}, ""))
    assert script.verdict("requirements/runtime.txt") == 0
    vulnerable = {**DEP, "vulns": [{"id": "GHSA-xxxx"}]}
    monkeypatch.setattr(script, "audit", lambda lock: (1, {"dependencies": [vulnerable]}, ""))
    monkeypatch.setenv("AUDIT_DEPS_ALLOW_UNCHECKED", "1")
    assert script.verdict("requirements/runtime.txt") == 1


def test_the_makefile_fails_when_pip_audit_cannot_be_installed(tmp_path: Path) -> None:
    """``make audit-deps`` with an interpreter that cannot make the tools' venv: not checked, non-zero."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    args = ["make", "-s", "audit-deps", "PYTHON=false", f"SUPPLY={tmp_path / 'supply'}"]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=False)  # noqa: S603
    assert done.returncode != 0 and "NOT CHECKED" in done.stdout
    allowed = subprocess.run(args, cwd=ROOT, env={**env, "AUDIT_DEPS_ALLOW_UNCHECKED": "1"},  # noqa: S603
                             capture_output=True, text=True, check=False)
    assert allowed.returncode == 0 and "NOT CHECKED" in allowed.stdout
