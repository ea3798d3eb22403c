"""Shared fixtures: tenant personas (STYLE.md rule 11), a fast password hasher, a fresh auth cache.

Personas: ``admin_a`` (staff, ``admin`` member of tenant A), ``viewer_a`` (staff, ``viewer`` member of
A), ``outsider_b`` (staff, ``admin`` member of tenant B only) and ``superuser``. Each tenant has a
default upstream with a recognisable credential, a route and an API key, so every test can ask
"does A's persona ever see B's rows?".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

#: Credentials recognisable in any page or row they must not appear in.
CREDENTIAL_A = "sk-tenant-a-secret-credential-3f9a"
CREDENTIAL_B = "sk-tenant-b-secret-credential-77b1"
HEADER_SECRET_A = "hdr-tenant-a-secret-value-5c2e"


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings: Any) -> None:
    """MD5 hashing: test users are created in every admin test, PBKDF2 would dominate the run time."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True, scope="session")
def _private_journal(tmp_path_factory: pytest.TempPathFactory) -> None:
    """This test process journals into a folder of its own (never another run's, never var/journal)."""
    from django.conf import settings

    settings.JOURNAL_DIR = str(tmp_path_factory.mktemp("journal"))
    settings.JOURNAL_PING_SECONDS = settings.JOURNAL_ORPHAN_SCAN_SECONDS = 3600.0  # no database use between tests


@pytest.fixture(autouse=True)
def _journal_drained() -> Iterator[None]:
    """After each test, the audit records it journaled are in the database before the tables are flushed, and
    the writer holds no connection (pytest-django drops the test database at the end)."""
    yield
    from audit.journal_writer import drained, writer

    assert drained(15), "the audit journal did not drain within 15 s"
    running = writer()
    if running is not None:
        assert running.release_connection(), "the journal writer did not release its connection"


@pytest.fixture(autouse=True)
def _fresh_key_cache() -> Iterator[None]:
    """Each test starts with an empty API key cache (it lives for the whole process otherwise)."""
    from tenants import auth, last_good
    from tenants.key_cache import key_cache

    key_cache.clear()
    last_good.forget_all()
    auth._in_doubt = False  # a database failure of an earlier test says nothing of this one's
    yield
    key_cache.clear()
    last_good.forget_all()


@pytest.fixture(autouse=True)
def _fresh_shared_state() -> Iterator[None]:
    """Each test starts with empty limit counters (wrong-key counts of 127.0.0.1 would add up otherwise)."""
    from infra.shared_state import reset_state

    reset_state(None)
    yield
    reset_state(None)


@dataclass
class TenantWorld:
    """A tenant with what it owns: its default upstream, a route and an API key (raw key kept here)."""

    tenant: Any
    upstream: Any
    route: Any
    api_key: Any
    raw_key: str


def _world(name: str, slug: str, credential: str, headers: dict[str, str] | None = None) -> TenantWorld:
    from tenants.models import Tenant
    from tenants.services import api_key_create, route_upsert, upstream_upsert

    tenant = Tenant.objects.create(name=name, slug=slug)
    upstream = upstream_upsert(tenant=tenant, name=f"{slug}-upstream", base_url=f"https://api.{slug}.test/v1",
                               credential=credential, extra_headers=headers)
    tenant.default_upstream = upstream
    tenant.save(update_fields=["default_upstream"])
    route = route_upsert(tenant=tenant, public_name=f"{slug}-model", upstream=upstream,
                         upstream_model=f"{slug}-upstream-model")
    key, raw = api_key_create(tenant=tenant, name=f"{slug}-key")
    return TenantWorld(tenant, upstream, route, key, raw)


@pytest.fixture
def world_a(db: None) -> TenantWorld:
    """Tenant A and its rows."""
    return _world("Tenant A", "tenant-a", CREDENTIAL_A, {"X-Org": HEADER_SECRET_A})


@pytest.fixture
def world_b(db: None) -> TenantWorld:
    """Tenant B and its rows."""
    return _world("Tenant B", "tenant-b", CREDENTIAL_B)


def _staff(username: str, world: TenantWorld | None = None, role: str = "") -> User:
    from tenants.models import Membership

    user = User.objects.create_user(username=username, password="pw", is_staff=True)
    if world is not None:
        Membership.objects.create(user=user, tenant=world.tenant, role=role)
    return user


@pytest.fixture
def admin_a(world_a: TenantWorld, world_b: TenantWorld) -> User:
    """Staff user with the ``admin`` role in tenant A (tenant B exists too)."""
    return _staff("admin-a", world_a, "admin")


@pytest.fixture
def viewer_a(world_a: TenantWorld, world_b: TenantWorld) -> User:
    """Staff user with the ``viewer`` role in tenant A."""
    return _staff("viewer-a", world_a, "viewer")


@pytest.fixture
def outsider_b(world_a: TenantWorld, world_b: TenantWorld) -> User:
    """Staff user with the ``admin`` role in tenant B only."""
    return _staff("outsider-b", world_b, "admin")


@pytest.fixture
def superuser(world_a: TenantWorld, world_b: TenantWorld) -> User:
    """A superuser: sees every tenant."""
    return User.objects.create_superuser(username="root", email="", password="pw")


@pytest.fixture
def login(client: Client) -> Callable[[User], Client]:
    """``login(user)`` -> the test client, logged in as ``user``."""

    def _login(user: User) -> Client:
        client.force_login(user)
        return client

    return _login


@pytest.fixture(autouse=True)
def _shipped_prices() -> Iterator[None]:
    """Each test charges with the shipped default prices and reads no price from the database (a test about
    prices loads them itself: ``billing.book.reset(billing.book.load())``)."""
    from billing import book

    book.reset(book.PriceBook(book.defaults(), loaded=float("inf")))
    yield
    book.reset(book.PriceBook(book.defaults(), loaded=float("inf")))
