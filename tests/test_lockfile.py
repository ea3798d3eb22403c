"""The hashed lock files agree with pyproject.toml (the one place for ranges), and the image uses one.

A range changed without `make lock` would ship an image with other versions than CI tested: this
catches it offline (no index needed).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)(?:\s*;\s*([^\\]+?))?\s*\\?$")


def _pins(lock: str) -> dict[str, tuple[str, int]]:
    """name -> (version, hash count) of a uv/pip-tools lock file (first pin of a name wins)."""
    pins: dict[str, tuple[str, int]] = {}
    current = ""
    for line in (ROOT / lock).read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            pins.setdefault(current, (match.group(2), 0))
        elif line.strip().startswith("--hash=sha256:") and current:
            version, count = pins[current]
            pins[current] = (version, count + 1)
    return pins


@pytest.mark.parametrize("lock, groups", [("requirements/runtime.txt", ("dependencies",)),
                                          ("requirements/dev.txt", ("dependencies", "dev"))])
def test_every_declared_dependency_is_locked_within_its_range_with_hashes(lock: str, groups: tuple[str, ...]) -> None:
    pins = _pins(lock)
    declared = [*PROJECT["dependencies"], *(PROJECT["optional-dependencies"]["dev"] if "dev" in groups else [])]
    for text in declared:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in {lock}: run `make lock`"
        version, hashes = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), f"{name}=={version} outside {text}"
    assert all(count >= 1 for _, count in pins.values()), "every pin carries at least one hash"


def test_the_image_installs_exactly_the_runtime_lock() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes --no-deps -r requirements/runtime.txt" in dockerfile
    assert "pip install ." not in dockerfile


def test_make_install_installs_exactly_the_dev_lock() -> None:
    """Issue 24 item 13: developer and CI environments come from the hashed lock, not from the ranges."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(STAMP): ", 1)[1].split("\n\n", 1)[0]
    assert "requirements/dev.txt" in recipe.splitlines()[0], "a changed lock reinstalls"
    assert "pip install --disable-pip-version-check --require-hashes -r requirements/dev.txt" in recipe
    assert "--no-deps -e ." in recipe and "'.[dev]'" not in recipe
