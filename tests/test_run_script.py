"""``scripts/run.sh`` (`make run`) on a taken port stops before it writes ``var/run.env`` or touches the
demo tenant, so the demo already serving keeps working. Run from a copy of the script in an empty
checkout (its own ``var/``), with the project's venv."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """An empty checkout holding only scripts/run.sh and the venv (no manage.py: nothing else can run)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "run.sh", tmp_path / "scripts" / "run.sh")
    (tmp_path / ".venv").symlink_to((ROOT / ".venv").resolve())
    return tmp_path


@pytest.fixture
def listener() -> Iterator[int]:
    """A port something listens on, as a running `make run` would."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(checkout: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PORT", "SIMULATOR_PORT", "SITE_URL", "UPSTREAM_URL")}
    command = ["bash", str(checkout / "scripts" / "run.sh")]
    return subprocess.run(command, env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False)  # noqa: S603


def test_a_taken_server_port_changes_nothing(checkout: Path, listener: int) -> None:
    done = _run(checkout, PORT=str(listener), SIMULATOR_PORT=str(_free_port()))
    assert done.returncode == 1
    assert f"port already in use (PORT={listener})" in done.stderr and "Nothing was changed" in done.stderr
    assert not (checkout / "var" / "run.env").exists()
    assert "Starting" not in done.stdout and "Serving" not in done.stdout


def test_a_taken_simulator_port_changes_nothing(checkout: Path, listener: int) -> None:
    done = _run(checkout, PORT=str(_free_port()), SIMULATOR_PORT=str(listener))
    assert done.returncode == 1 and f"SIMULATOR_PORT={listener}" in done.stderr
    assert not (checkout / "var" / "run.env").exists()


def test_with_a_real_upstream_the_simulator_port_does_not_matter(checkout: Path, listener: int) -> None:
    """No simulator is started then; the script goes on (and stops at the missing manage.py of the copy)."""
    port = _free_port()
    done = _run(checkout, PORT=str(port), SIMULATOR_PORT=str(listener), UPSTREAM_URL="https://api.example.com/v1")
    assert "already in use" not in done.stderr
    assert f"PORT={port}\n" in (checkout / "var" / "run.env").read_text()
