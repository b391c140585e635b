"""Sign-ins, sign-outs and two-factor changes into the audit chain of each tenant the person
belongs to. accounts.receivers calls these from allauth's and auth's signals."""

from __future__ import annotations

from typing import Any

from allauth.account.authentication import get_authentication_records
from allauth.mfa.models import Authenticator
from django.db import transaction

from approvals.audit.chain import append
from approvals.models import Membership

# The ways in to the console, as the audit names them.
PASSWORD = "password"
PASSKEY = "passkey"
SSO = "sso"


def record_for_tenants(*, user, action: str, detail: dict[str, Any] | None = None) -> int:
    """Append the event to the chain of every tenant the user belongs to.

    Side effects: one audit event per tenant (none for a user in no tenant). Returns how many.
    """
    tenant_ids = list(Membership.objects.filter(user=user).values_list("tenant_id", flat=True))
    for tenant_id in tenant_ids:
        with transaction.atomic():
            append(tenant_id=tenant_id, action=action, actor=user, detail=detail or {})
    return len(tenant_ids)


def sign_in_detail(records: list[dict]) -> dict[str, Any]:
    """How the session was signed in, from allauth's authentication records: the method
    (password, passkey, sso with its provider) and the second factor (totp, webauthn,
    recovery_codes, or none). Reauthentications later in the session do not count."""
    records = [r for r in records if not r.get("reauthenticated")]
    detail: dict[str, Any] = {"method": "", "second_factor": "none"}
    for record in records:
        method = record.get("method")
        if method == "mfa" and record.get("passwordless"):
            detail["method"] = detail["method"] or PASSKEY
        elif method == "mfa":
            detail["second_factor"] = str(record.get("type", "")) or "none"
        elif method == "socialaccount":
            detail["method"] = detail["method"] or SSO
            detail["provider"] = str(record.get("provider", ""))
        elif method and not detail["method"]:
            detail["method"] = str(method)
    detail["method"] = detail["method"] or "unknown"
    return detail


def record_sign_in(*, request, user, extra: dict | None = None) -> int:
    """auth.signed_in for each tenant, with how (sign_in_detail, and extra: the provider's
    name for single sign-on). Side effects: audit events."""
    detail = sign_in_detail(get_authentication_records(request, user)) | (extra or {})
    return record_for_tenants(user=user, action="auth.signed_in", detail=detail)


def record_sign_out(*, user) -> int:
    """auth.signed_out for each tenant. Side effects: audit events (none without a user)."""
    if user is None or not getattr(user, "pk", None):
        return 0
    return record_for_tenants(user=user, action="auth.signed_out")


def record_enrolled(*, user, authenticator: Authenticator) -> int:
    """mfa.enrolled with the type added. Side effects: audit events."""
    return record_for_tenants(user=user, action="mfa.enrolled", detail={"type": authenticator.type})


def record_removed(*, user, authenticator: Authenticator) -> int:
    """mfa.removed with the type removed. Side effects: audit events."""
    return record_for_tenants(user=user, action="mfa.removed", detail={"type": authenticator.type})


def record_reset(*, user, authenticator: Authenticator) -> int:
    """mfa.recovery_codes_reset when new recovery codes replace the old. Side effects: audit
    events (none for another kind of reset)."""
    if authenticator.type != Authenticator.Type.RECOVERY_CODES:
        return 0
    return record_for_tenants(user=user, action="mfa.recovery_codes_reset")


def record_used(*, user, authenticator: Authenticator) -> int:
    """mfa.recovery_code_used with the codes left, when the factor used was a recovery code;
    other factors are in the sign-in's or step-up's own event. Side effects: audit events."""
    if authenticator.type != Authenticator.Type.RECOVERY_CODES:
        return 0
    # allauth marks the code used on a fresh copy of the row: read the row again.
    current = Authenticator.objects.filter(pk=authenticator.pk).first() or authenticator
    left = len(current.wrap().get_unused_codes())
    return record_for_tenants(user=user, action="mfa.recovery_code_used", detail={"left": left})


def record_failed(*, user, authenticator: Authenticator, reauthentication: bool) -> int:
    """mfa.failed with the type that refused the code. Side effects: audit events."""
    detail: dict[str, Any] = {"type": authenticator.type}
    if reauthentication:
        detail["reauthentication"] = True
    return record_for_tenants(user=user, action="mfa.failed", detail=detail)
