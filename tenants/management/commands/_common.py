"""Helpers shared by the tenants management commands (a leading underscore: not a command itself)."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError
from django.db.models import Q

from tenants.models import Tenant


def tenant_named(name: str) -> Tenant:
    """The tenant whose name or slug is ``name``; ``CommandError`` when there is none."""
    tenant = Tenant.objects.filter(Q(name=name) | Q(slug=name)).order_by("pk").first()
    if tenant is None:
        raise CommandError(f"no tenant named {name!r} (create one with `python manage.py provision`)")
    return tenant


def base_url() -> str:
    """The OpenAI-style base URL of this proxy (``SITE_URL`` + ``/v1``)."""
    return f"{settings.SITE_URL}/v1"


def client_urls() -> list[str]:
    """Human-readable lines telling clients where to point."""
    return [
        f"OpenAI base URL:    {base_url()}   (OPENAI_BASE_URL; chat completions, responses, models)",
        f"Anthropic base URL: {settings.SITE_URL}   (ANTHROPIC_BASE_URL; /v1/messages)",
    ]
