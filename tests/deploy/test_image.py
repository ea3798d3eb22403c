"""The Docker image's inputs, checked without Docker: its copy list holds every package the settings
load, its build step (collectstatic) runs on exactly the files it copies, and every volume the compose
file mounts into the app exists in the image, owned by the image's non-root user.

The build step runs in a temporary folder holding only what the Dockerfile's ``COPY`` lines name, with
the project's own packages hidden from the interpreter (the development venv installs them in editable
mode, which would otherwise resolve ``import alerts`` to this checkout and hide a missing copy).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
WORKDIR = "/app"
#: Top-level folders with an ``__init__.py`` that the image does not need (test and benchmark code).
NOT_SHIPPED = {"tests", "bench"}
#: Runs ``manage.py`` with the project's editable-install finder removed, so only the copied files import.
BOOTSTRAP = """\
import importlib.util, os, runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in getattr(h, "__module__", "")]
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
for name in sys.argv.pop(1).split(","):  # a project package found outside the copied tree hides a missing copy
    spec = importlib.util.find_spec(name)
    if spec is not None and not str(spec.origin).startswith(os.getcwd()):
        sys.exit(f"{name} would be imported from {spec.origin}, outside the copied tree")
sys.argv = ["manage.py", *sys.argv[1:]]
runpy.run_path("manage.py", run_name="__main__")
"""


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    joined = DOCKERFILE.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, rest = line.partition(" ")
            out.append((name.upper(), rest.strip()))
    return out


def copied() -> list[tuple[str, str]]:
    """(source, destination) of every ``COPY`` (destination relative to the work dir, '.' for it)."""
    pairs = []
    for name, rest in _instructions():
        if name == "COPY":
            *sources, dest = shlex.split(rest)
            for source in sources:
                target = dest if dest not in ("./", ".") else (source if (ROOT / source).is_file() else ".")
                pairs.append((source, target.rstrip("/") or "."))
    return pairs


def shipped_packages() -> set[str]:
    """The repository's top-level Python packages the image must hold."""
    return {p.parent.name for p in ROOT.glob("*/__init__.py")} - NOT_SHIPPED


def test_the_image_copies_every_package_and_installed_app() -> None:
    sources = {source.rstrip("/") for source, _ in copied()}
    apps = {app.split(".")[0] for app in settings.INSTALLED_APPS}
    local_apps = {app for app in apps if (ROOT / app / "__init__.py").is_file()}
    assert shipped_packages() <= sources, f"not copied: {sorted(shipped_packages() - sources)}"
    assert local_apps <= sources, f"installed apps not copied: {sorted(local_apps - sources)}"
    assert {"manage.py", "templates"} <= sources


def _build_tree(into: Path) -> None:
    """Copy what the Dockerfile's COPY lines name (as the image lays it out) into ``into``."""
    for source, dest in copied():
        src = ROOT / source
        target = into / (source if dest == "." else dest)
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def _build_steps() -> list[list[str]]:
    """The Dockerfile's ``RUN python manage.py ...`` steps as argument lists (after ``manage.py``)."""
    steps = []
    for name, rest in _instructions():
        if name == "RUN" and rest.startswith("python manage.py "):
            steps.append(shlex.split(rest)[2:])
    return steps


def _manage(app: Path, step: list[str]) -> subprocess.CompletedProcess[str]:
    """``manage.py STEP`` in ``app`` as at build time: the Dockerfile's ENV only, none of the caller's variables."""
    env = {"PATH": os.environ["PATH"], "HOME": str(app), "PYTHONPATH": str(app), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-c", BOOTSTRAP, ",".join(sorted(shipped_packages())), *step]
    return subprocess.run(command, cwd=app, env=env, capture_output=True, text=True, timeout=300, check=False)  # noqa: S603


def test_the_build_step_runs_on_exactly_the_copied_files(tmp_path: Path) -> None:
    _build_tree(tmp_path)
    steps = _build_steps()
    assert steps, "the Dockerfile runs no manage.py step"
    for step in steps:
        done = _manage(tmp_path, step)
        assert done.returncode == 0, f"manage.py {' '.join(step)}:\n{done.stdout}\n{done.stderr}"
    assert any((tmp_path / "staticfiles").rglob("*.css"))


def test_the_copied_tree_cannot_import_a_package_it_lacks(tmp_path: Path) -> None:
    """The check above can fail: without ``alerts`` the same step stops at the missing module."""
    _build_tree(tmp_path)
    shutil.rmtree(tmp_path / "alerts")
    done = _manage(tmp_path, _build_steps()[0])
    assert done.returncode != 0 and "No module named 'alerts'" in done.stderr


def test_every_app_volume_exists_in_the_image_owned_by_its_user() -> None:
    """A named volume starts as a copy of the image's folder (owner included): each must be made there and
    handed to the non-root user, or the process cannot write the volume."""
    app = COMPOSE["x-app"]
    targets = [v.split(":")[1] for v in app["volumes"]]
    assert targets, "the app mounts no volume"
    runs = " && ".join(rest for name, rest in _instructions() if name == "RUN")
    user = next(rest for name, rest in _instructions() if name == "USER")
    assert "--uid 10001" in runs and user == "toolrelay"
    made = {word for word in shlex.split(runs.replace("&&", " ")) if word.startswith(WORKDIR + "/")}
    for target in targets:
        assert target in made, f"{target} is mounted but the image never creates it"
        assert target.startswith(f"{WORKDIR}/var/"), target
    assert f"chown -R toolrelay {WORKDIR}/var" in runs
    assert app["environment"]["JOURNAL_DIR"] in targets


def test_the_compose_file_is_valid(tmp_path: Path) -> None:
    """``docker compose config`` where the compose plugin is installed (with .env.example as the .env), and
    the parse's structure everywhere."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0:  # noqa: S603
        shutil.copy2(ROOT / "docker-compose.yml", tmp_path / "docker-compose.yml")
        shutil.copy2(ROOT / ".env.example", tmp_path / ".env")
        command = [docker, "compose", "config", "--quiet"]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)  # noqa: S603
        assert done.returncode == 0, done.stderr
    services = COMPOSE["services"]
    assert {"postgres", "redis", "migrate", "web", "proxy", "worker", "beat"} <= set(services)
    named = set(COMPOSE["volumes"])
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith(".") or source in named, f"{name}: undeclared volume {source}"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
