"""What the tenant and member commands look up by name, with the line they say when it is
missing."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from approvals.models import Tenant


def tenant_named(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise CommandError(f"no tenant {slug!r}")
    return tenant


def user_named(username: str):
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no user named {username!r}")
    return user
