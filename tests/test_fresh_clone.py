"""A fresh clone with nothing beside it: the suite collects, and the corpus checks pass, without
``../shared`` and with an operator's variables exported (issue 26 item 2: collection stopped with exit 2
where a test read the shared fault corpus at import time).

The repository's tracked files are copied into a temporary folder that has no ``shared/`` beside it, and
pytest runs there with this venv's interpreter, the copy first on ``sys.path`` (so its packages, not this
checkout's editable install, are the ones imported).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_environment import OPERATOR_SHELL

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files (as ``git clone`` lays them out) in ``<tmp>/toolrelay``, no ``<tmp>/shared``; outside
    a git checkout (an unpacked archive) the tree less what is never tracked (``UNTRACKED``)."""
    into = tmp_path_factory.mktemp("fresh") / "toolrelay"
    for name in _tracked():
        source = ROOT / name
        if name and source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    assert not (into.parent / "shared").exists()
    return into


#: What ``.gitignore`` keeps out of a checkout: the venv, runtime state, caches.
UNTRACKED = frozenset({".git", ".venv", "var", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache",
                       ".pytest_cache", ".hypothesis", "staticfiles", "media", "build", ".env"})


def _tracked() -> list[str]:
    """The repository's files, relative to ``ROOT``: ``git ls-files`` in a checkout, else a walk."""
    if shutil.which("git") is not None and (ROOT / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)  # noqa: S607
        return listed.stdout.decode().split("\0")
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
            if p.is_file() and not UNTRACKED.intersection(p.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)]


def _pytest(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in ``clone`` as an operator's shell would run it: SQLite (no DATABASE_URL), their variables set."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTEST_ADDOPTS")}
    env.update(OPERATOR_SHELL, PYTHONPATH=str(clone), PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args]
    return subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=300, check=False)  # noqa: S603


def test_the_suite_collects_without_the_shared_corpus(clone: Path) -> None:
    done = _pytest(clone, "--collect-only")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " tests collected" in done.stdout and "error" not in done.stdout.splitlines()[-1]


def test_the_own_corpus_covers_every_kind_without_the_shared_one(clone: Path) -> None:
    done = _pytest(clone, "tests/test_fault_corpus.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1]
