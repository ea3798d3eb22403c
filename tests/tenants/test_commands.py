"""Management commands: provision, apikey, credential_key and demo_setup."""

from __future__ import annotations

import json
import re
import stat
from io import StringIO
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from tenants.auth import principal_for_key
from tenants.models import ApiKey, ModelRoute, Tenant, Upstream
from tenants.services import upstream_upsert
from tests.conftest import TenantWorld

pytestmark = pytest.mark.django_db

RAW_KEY = re.compile(r"tr-[a-z0-9]{12}-[A-Za-z0-9_-]{43}")


def _run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _provision(*extra: str) -> str:
    return _run("provision", "--tenant", "Acme", "--upstream-url", "https://api.deepseek.com/v1", *extra)


def test_it_provisions_idempotently() -> None:
    """Twice: one tenant, one upstream, routes updated in place, the stored credential kept."""
    _provision("--upstream-key", "sk-deepseek-1111", "--route", "gpt-4o=deepseek-chat", "claude-*=deepseek-chat")
    _provision("--route", "gpt-4o=deepseek-reasoner", "--route", "o3=deepseek-reasoner")
    tenant = Tenant.objects.get()
    assert Upstream.objects.filter(tenant=tenant).count() == 1
    assert tenant.default_upstream is not None and tenant.default_upstream.credential() == "sk-deepseek-1111"
    routes = dict(ModelRoute.objects.filter(tenant=tenant).values_list("public_name", "upstream_model"))
    assert routes == {"gpt-4o": "deepseek-reasoner", "claude-*": "deepseek-chat", "o3": "deepseek-reasoner"}


def test_it_prints_json_that_is_usable_as_is() -> None:
    """``--json`` prints one object whose key authenticates and whose base URL is the OpenAI-style one."""
    payload = json.loads(_provision("--json"))
    assert set(payload) == {"tenant", "api_key", "base_url"}
    principal = principal_for_key(payload["api_key"])
    assert payload["tenant"] == "Acme"
    assert principal is not None and principal.tenant_id == Tenant.objects.get(name="Acme").pk
    assert payload["base_url"] == f"{settings.SITE_URL}/v1" and payload["base_url"].endswith("/v1")


def test_it_prints_a_key_and_the_urls_for_people() -> None:
    """Without ``--json``: the new key (once) and both base URLs."""
    output = _provision("--upstream-key", "sk-deepseek-1111")
    assert RAW_KEY.search(output) and f"{settings.SITE_URL}/v1" in output
    assert "sk-deepseek-1111" not in output and "sk-…1111" in output


def test_it_rotates_the_upstream_credential_without_the_url_or_a_new_key() -> None:
    """A rerun with ``--upstream-key`` alone: the credential changes, the URL and the keys stay."""
    first = json.loads(_provision("--upstream-key", "sk-deepseek-1111", "--json"))
    output = _run("provision", "--tenant", "Acme", "--upstream-key", "sk-deepseek-2222")
    tenant = Tenant.objects.get()
    assert tenant.default_upstream is not None and tenant.default_upstream.credential() == "sk-deepseek-2222"
    assert tenant.default_upstream.base_url == "https://api.deepseek.com/v1"
    assert "No new API key" in output and not RAW_KEY.search(output) and "sk-…2222" in output
    assert list(ApiKey.objects.values_list("name", flat=True)) == ["provisioned"]
    assert principal_for_key(first["api_key"]) is not None


def test_it_makes_another_key_only_when_asked_with_a_distinct_name() -> None:
    """Reruns make no key; ``--new-key`` makes one named apart from the others (``--key-name`` to choose)."""
    _provision()
    rerun = json.loads(_provision("--route", "gpt-4o=deepseek-chat", "--json"))
    assert rerun["api_key"] is None and ApiKey.objects.count() == 1
    second = json.loads(_provision("--new-key", "--json"))
    third = _provision("--new-key")
    _provision("--new-key", "--key-name", "ci-bot")
    assert principal_for_key(second["api_key"]) is not None and "'provisioned-3'" in third and RAW_KEY.search(third)
    names = sorted(ApiKey.objects.values_list("name", flat=True))
    assert names == ["ci-bot", "provisioned", "provisioned-2", "provisioned-3"]


def test_a_tenant_whose_keys_are_all_revoked_gets_a_new_one() -> None:
    _provision()
    ApiKey.objects.update(revoked_at=timezone.now())
    payload = json.loads(_provision("--json"))
    assert principal_for_key(payload["api_key"]) is not None
    assert ApiKey.objects.get(revoked_at=None).name == "provisioned-2"


@pytest.mark.parametrize("args, message", [
    ((), "has no upstream yet"),
    (("--upstream-url", "https://api.x.test/v1", "--key-name", " "), "--key-name"),
    (("--upstream-url", "https://api.x.test/v1", "--key-name", "k" * 91), "--key-name"),
    (("--upstream-url", "not a url"), "invalid upstream"),
    (("--upstream-url", "https://api.x.test/v1", "--route", "=model"), "PUBLIC=UPSTREAM_MODEL"),
])
def test_it_refuses_bad_input(args: tuple[str, ...], message: str) -> None:
    """Bad URLs and routes are command errors, and nothing is created."""
    with pytest.raises(CommandError, match=message):
        _run("provision", "--tenant", "Acme", *args)
    assert not Tenant.objects.exists()


def test_it_creates_lists_and_revokes_keys(world_a: TenantWorld) -> None:
    """``apikey create`` prints a working key once; ``list`` shows prefixes only; ``revoke`` takes prefix or id."""
    created = _run("apikey", "create", "--tenant", "Tenant A", "--name", "laptop")
    raw = RAW_KEY.search(created)
    assert raw is not None and principal_for_key(raw.group(0)) is not None
    listing = _run("apikey", "list", "--tenant", "tenant-a")
    key = ApiKey.objects.get(name="laptop")
    assert key.display in listing and "laptop" in listing
    assert raw.group(0) not in listing and key.digest not in listing and world_a.raw_key not in listing
    _run("apikey", "revoke", "--tenant", "Tenant A", key.prefix)
    _run("apikey", "revoke", "--tenant", "Tenant A", str(world_a.api_key.pk))
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert ApiKey.objects.get(pk=world_a.api_key.pk).revoked_at is not None
    assert "revoked" in _run("apikey", "list", "--tenant", "Tenant A")


@pytest.mark.parametrize("form", ["{p}", "tr-{p}", "tr-{p}-", "tr-{p}-…"])
def test_it_revokes_a_key_by_any_form_of_its_prefix(form: str, world_a: TenantWorld) -> None:
    """``revoke`` takes the prefix as ``list`` shows it, or as a user copies it."""
    key = world_a.api_key
    _run("apikey", "revoke", "--tenant", "Tenant A", form.format(p=key.prefix))
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None


def test_it_creates_keys_with_an_expiry_and_as_json(world_a: TenantWorld) -> None:
    """``--expires-days`` sets the expiry; ``--json`` prints the provision-style object."""
    payload = json.loads(_run("apikey", "create", "--tenant", "Tenant A", "--expires-days", "7", "--json"))
    assert principal_for_key(payload["api_key"]) is not None
    assert ApiKey.objects.get(prefix=payload["api_key"].split("-")[1]).expires is not None


def test_it_refuses_to_revoke_another_tenants_key_like_a_missing_one(world_a: TenantWorld,
                                                                     world_b: TenantWorld) -> None:
    """Revoking B's key as tenant A fails with the same error as a key that does not exist."""
    with pytest.raises(CommandError) as not_yours:
        _run("apikey", "revoke", "--tenant", "Tenant A", world_b.api_key.prefix)
    with pytest.raises(CommandError) as missing:
        _run("apikey", "revoke", "--tenant", "Tenant A", "zzzzzzzzzzzz")
    assert str(not_yours.value).replace(world_b.api_key.prefix, "?") == str(missing.value).replace("zzzzzzzzzzzz", "?")
    assert ApiKey.objects.get(pk=world_b.api_key.pk).revoked_at is None


def test_it_names_the_missing_tenant() -> None:
    """An unknown tenant is a command error."""
    with pytest.raises(CommandError, match="no tenant named 'ghost'"):
        _run("apikey", "list", "--tenant", "ghost")


def test_it_prints_a_new_fernet_key() -> None:
    """``credential_key`` prints a key Fernet accepts."""
    key = _run("credential_key").strip()
    assert Fernet(key.encode()).decrypt(Fernet(key.encode()).encrypt(b"x")) == b"x"


def test_it_rotates_stored_credentials_to_the_newest_key() -> None:
    """``credential_key --rotate`` re-encrypts, after which the old key can leave CREDENTIAL_KEYS."""
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    tenant = Tenant.objects.create(name="R", slug="r")
    with override_settings(CREDENTIAL_KEYS=[old]):
        upstream = upstream_upsert(tenant=tenant, name="u", base_url="https://api.x.test/v1", credential="sk-r-4242")
    with override_settings(CREDENTIAL_KEYS=[new, old]):
        assert "1 upstream" in _run("credential_key", "--rotate")
    with override_settings(CREDENTIAL_KEYS=[new]):
        assert Upstream.objects.get(pk=upstream.pk).credential() == "sk-r-4242"
    with override_settings(CREDENTIAL_KEYS=[Fernet.generate_key().decode()]), pytest.raises(CommandError):
        _run("credential_key", "--rotate")


@override_settings(UPSTREAM_ALLOW_NETWORKS=["127.0.0.1/32"])
def test_it_sets_up_the_demo_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """First run: a superuser and a demo tenant on the simulator, login and key printed; second run changes nothing.

    The simulator is on loopback: the demo allows it explicitly, as `make run` does (scripts/run.sh)."""
    monkeypatch.delenv("UPSTREAM_URL", raising=False)
    monkeypatch.setenv("SIMULATOR_PORT", "8123")
    first = _run("demo_setup")
    password = re.search(r"password (\S+)", first)
    raw = RAW_KEY.search(first)
    assert password is not None and raw is not None
    assert User.objects.get(username="admin").check_password(password.group(1))
    principal = principal_for_key(raw.group(0))
    assert principal is not None and principal.tenant_id == Tenant.objects.get(name="demo").pk
    assert principal.default_target is not None and principal.default_target.base_url == "http://127.0.0.1:8123/v1"
    assert f"{settings.SITE_URL}/v1" in first and f"{settings.SITE_URL}/admin/" in first
    second = _run("demo_setup")
    assert "python manage.py apikey create --tenant demo" in second
    assert not RAW_KEY.search(second) and password.group(1) not in second
    assert Tenant.objects.count() == 1 and ApiKey.objects.count() == 1 and User.objects.count() == 1


def test_the_demo_names_the_allow_list_when_its_simulator_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the allow-list the loopback simulator is refused, with a message that says what to set."""
    monkeypatch.delenv("UPSTREAM_URL", raising=False)
    with pytest.raises(CommandError, match="UPSTREAM_ALLOW_NETWORKS=127.0.0.1/32"):
        _run("demo_setup")
    assert not Tenant.objects.exists() and not User.objects.exists()


def test_it_points_the_demo_at_a_real_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """``UPSTREAM_URL`` / ``UPSTREAM_API_KEY`` replace the simulator."""
    monkeypatch.setenv("UPSTREAM_URL", "https://api.deepseek.com/v1")
    monkeypatch.setenv("UPSTREAM_API_KEY", "sk-demo-real-0042")
    output = _run("demo_setup")
    upstream = Tenant.objects.get(name="demo").default_upstream
    assert upstream is not None and upstream.base_url == "https://api.deepseek.com/v1"
    assert upstream.credential() == "sk-demo-real-0042" and "sk-demo-real-0042" not in output


@override_settings(UPSTREAM_ALLOW_NETWORKS=["127.0.0.1/32"])
def test_it_writes_the_first_run_login_to_a_private_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The password and key printed once are also in a mode-600 file whose path is printed."""
    monkeypatch.delenv("UPSTREAM_URL", raising=False)
    path = tmp_path / "var" / "demo-credentials.txt"
    output = _run("demo_setup", "--credentials-file", str(path))
    password = re.search(r"password (\S+)", output)
    raw = RAW_KEY.search(output)
    assert password is not None and raw is not None
    assert str(path.resolve()) in output and stat.S_IMODE(path.stat().st_mode) == 0o600
    saved = path.read_text()
    assert password.group(1) in saved and raw.group(0) in saved and f"{settings.SITE_URL}/admin/" in saved


@override_settings(UPSTREAM_ALLOW_NETWORKS=["127.0.0.1/32"])
def test_it_moves_the_demo_to_the_simulators_new_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A later run on another SIMULATOR_PORT points the demo tenant there; a real upstream is never moved."""
    monkeypatch.delenv("UPSTREAM_URL", raising=False)
    monkeypatch.setenv("SIMULATOR_PORT", "8123")
    _run("demo_setup", "--credentials-file", str(tmp_path / "c.txt"))
    monkeypatch.setenv("SIMULATOR_PORT", "9123")
    assert "moved from http://127.0.0.1:8123/v1 to http://127.0.0.1:9123/v1" in _run("demo_setup")
    upstream = Tenant.objects.get(name="demo").default_upstream
    assert upstream is not None and upstream.base_url == "http://127.0.0.1:9123/v1"
    upstream_upsert(tenant=upstream.tenant, name=upstream.name, base_url="https://api.deepseek.com/v1")
    assert "moved" not in _run("demo_setup")
    assert Upstream.objects.get(pk=upstream.pk).base_url == "https://api.deepseek.com/v1"


def test_it_reads_the_ports_make_run_saved_without_overriding_the_environment(tmp_path: Path) -> None:
    """``load_run_settings`` (manage.py) takes SITE_URL and the ports from var/run.env; the environment
    wins, and nothing else in the file is taken."""
    from config.env import load_run_settings

    run_env = tmp_path / "run.env"
    run_env.write_text("# comment\nSITE_URL=http://127.0.0.1:9000\nPORT=9000\nSIMULATOR_PORT=9001\nSECRET_KEY=no\n")
    environ = {"SIMULATOR_PORT": "7001"}
    load_run_settings(run_env, environ)
    assert environ == {"SITE_URL": "http://127.0.0.1:9000", "PORT": "9000", "SIMULATOR_PORT": "7001"}
