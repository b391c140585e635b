"""The second factor a person proved in this session, as allauth records it, and where to
prove one again."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from urllib.parse import urlencode

from allauth.account.authentication import get_authentication_records
from allauth.mfa.models import Authenticator
from django.http import HttpRequest
from django.urls import reverse

# Where a person without any second factor sets one up.
SET_UP_URL_NAME = "mfa_index"


@dataclass(frozen=True)
class Factor:
    type: str  # totp, recovery_codes or webauthn
    at: dt.datetime


def last_factor(request: HttpRequest) -> Factor | None:
    """The latest second factor proven in this session: at sign-in or on reauthentication."""
    proven = [
        r
        for r in get_authentication_records(request, request.user)
        if r.get("method") == "mfa" and isinstance(r.get("at"), int | float)
    ]
    if not proven:
        return None
    latest = max(proven, key=lambda r: r["at"])
    return Factor(
        type=str(latest.get("type") or "mfa"),
        at=dt.datetime.fromtimestamp(latest["at"], tz=dt.UTC),
    )


def factor_types(user) -> set[str]:
    return set(Authenticator.objects.filter(user=user).values_list("type", flat=True))


def reauthenticate_url(user, next_url: str) -> str | None:
    """allauth's page that asks this user for a second factor, back to next_url afterwards;
    None when they have none. The authenticator app's code when they have one, else their
    passkey (recovery codes come with either, and are a last resort): allauth's page offers
    the other as a link."""
    types = factor_types(user)
    if Authenticator.Type.TOTP in types:
        name = "mfa_reauthenticate"
    elif Authenticator.Type.WEBAUTHN in types:
        name = "mfa_reauthenticate_webauthn"
    elif Authenticator.Type.RECOVERY_CODES in types:
        name = "mfa_reauthenticate"
    else:
        return None
    return f"{reverse(name)}?{urlencode({'next': next_url})}"
