"""The tenant rule "deciders must have two-factor": who lacks the second factor a tenant asks
its deciders for. decide.check_decider calls it, so the ticket page, the batch, the API and
`manage.py decide` refuse alike; the pages ask it to show a link instead of buttons that fail."""

from __future__ import annotations

from dataclasses import dataclass

from allauth.mfa.models import Authenticator
from allauth.mfa.utils import is_mfa_enabled
from django.urls import reverse

from approvals.decisions.errors import TwoFactorRequiredError
from approvals.models import Membership, Tenant

# Recovery codes alone are no second factor: they only ever come with one of these.
SECOND_FACTORS = (Authenticator.Type.TOTP, Authenticator.Type.WEBAUTHN)


def has_second_factor(user) -> bool:
    """The user has an authenticator app or a passkey / security key."""
    return is_mfa_enabled(user, types=SECOND_FACTORS)


def lacks_second_factor(membership: Membership, *, tenant: Tenant, user) -> bool:
    """A decider of a tenant that asks deciders for two-factor, without one."""
    return membership.can_decide and tenant.deciders_need_two_factor and not has_second_factor(user)


def check_second_factor(membership: Membership, *, tenant: Tenant, user) -> None:
    """Raises TwoFactorRequiredError when the tenant's deciders need two-factor and the user
    has none; reads nothing when the tenant does not ask for it."""
    if lacks_second_factor(membership, tenant=tenant, user=user):
        raise TwoFactorRequiredError(
            f"set up two-factor on your page ({reverse('mfa_index')}) before deciding: "
            "this team asks deciders for it"
        )


@dataclass(frozen=True)
class Factors:
    """A person's second factors, as their own page shows them."""

    totp: bool
    passkeys: int
    recovery_codes_left: int | None

    @property
    def enabled(self) -> bool:
        return self.totp or self.passkeys > 0


def factors_of(user) -> Factors:
    """What second factors the user has, in one query."""
    totp, passkeys, codes_left = False, 0, None
    for authenticator in Authenticator.objects.filter(user_id=user.pk):
        if authenticator.type == Authenticator.Type.TOTP:
            totp = True
        elif authenticator.type == Authenticator.Type.WEBAUTHN:
            passkeys += 1
        elif authenticator.type == Authenticator.Type.RECOVERY_CODES:
            codes_left = len(authenticator.wrap().get_unused_codes())
    return Factors(totp=totp, passkeys=passkeys, recovery_codes_left=codes_left)
