"""Failed and locked-out sign-ins reach the audit log. Auth offers only signals as a hook, so
the receivers live here (connected by AppConfig.ready) and do nothing but call the function."""

from __future__ import annotations

from axes.signals import user_locked_out
from django.contrib.auth.signals import user_login_failed
from django.db import transaction
from django.dispatch import receiver

from approvals.audit.chain import append
from approvals.models import Membership


def record_sign_in_failure(*, username: str, locked_out: bool) -> None:
    """Failed and locked-out sign-ins go into the audit chain of each tenant the name belongs to.

    Side effects: one audit event per tenant of the user named (none for unknown names, which
    would otherwise let anyone fill the log).
    """
    tenant_ids = list(
        Membership.objects.filter(user__username=username).values_list("tenant_id", flat=True)
    )
    for tenant_id in tenant_ids:
        with transaction.atomic():
            append(
                tenant_id=tenant_id,
                action="auth.locked_out" if locked_out else "auth.sign_in_failed",
                actor_name=username[:150],
                outcome="locked_out" if locked_out else "failed",
            )


@receiver(user_login_failed, dispatch_uid="approvals.sign_in_failed")
def _sign_in_failed(sender, credentials, request=None, **kwargs) -> None:
    record_sign_in_failure(username=str(credentials.get("username", "")), locked_out=False)


@receiver(user_locked_out, dispatch_uid="approvals.locked_out")
def _locked_out(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    record_sign_in_failure(username=str(username or ""), locked_out=True)
