"""The first-run steps for Docker Compose that docs/deployment.md and the README give (issue 26 item 1: neither
said how to make the first admin login or a tenant inside compose) name a compose service that has the app,
an existing management command, and only options that command accepts: each line is parsed by the
command's own argument parser, so a renamed flag fails here before it fails a reader."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
#: ``docker compose exec [-T] [-e X=Y ...] SERVICE python manage.py COMMAND ARGS``, continuation lines joined.
_STEP = re.compile(r"docker compose exec ((?:-\S+ (?:\S+=\S+ )?)*)(\S+) python manage\.py ([^`\n]+)")


def steps(text: str) -> list[tuple[str, list[str]]]:
    """``(service, [command, *args])`` of every compose ``manage.py`` step in ``text``."""
    found = []
    for match in _STEP.finditer(text.replace("\\\n", " ")):
        service, line = match.group(2), match.group(3).split("#", 1)[0]
        found.append((service, shlex.split(line)))
    return found


DOCS = {"docs/deployment.md": steps((ROOT / "docs" / "deployment.md").read_text()),
        "README.md": steps((ROOT / "README.md").read_text())}


def test_the_docs_give_the_first_admin_and_the_first_tenant() -> None:
    for name, found in DOCS.items():
        commands = {words[0] for _, words in found}
        assert {"createsuperuser", "provision"} <= commands, f"{name}: {sorted(commands)}"


@pytest.mark.parametrize(("doc", "service", "words"),
                         [(doc, service, words) for doc, found in DOCS.items() for service, words in found])
def test_each_step_runs_an_existing_command_with_options_it_accepts(doc: str, service: str, words: list[str]) -> None:
    app_services = {name for name, s in COMPOSE["services"].items() if s.get("image") == COMPOSE["x-app"]["image"]}
    assert service in app_services, f"{doc}: {service} is not a service running the app image"
    command, *args = words
    commands = get_commands()
    assert command in commands, f"{doc}: no management command {command!r}"
    parser = load_command_class(commands[command], command).create_parser("manage.py", command)
    try:
        parser.parse_args(args)
    except (CommandError, SystemExit) as exc:  # how Django's parser refuses outside a command line
        pytest.fail(f"{doc}: manage.py {command} refuses {args} ({exc})")
