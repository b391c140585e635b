"""allauth's signals, connected to the capability functions that act on them (AppConfig.ready).
Each receiver does nothing but call the function."""

from __future__ import annotations

from allauth.account.signals import user_logged_in
from allauth.mfa import signals as mfa_signals
from django.dispatch import receiver

from accounts import audit


@receiver(user_logged_in, dispatch_uid="accounts.signed_in")
def _signed_in(sender, request, user, **kwargs) -> None:
    audit.record_sign_in(request=request, user=user)


@receiver(mfa_signals.authenticator_added, dispatch_uid="accounts.mfa_enrolled")
def _mfa_enrolled(sender, request, user, authenticator, **kwargs) -> None:
    audit.record_enrolled(user=user, authenticator=authenticator)


@receiver(mfa_signals.authenticator_removed, dispatch_uid="accounts.mfa_removed")
def _mfa_removed(sender, request, user, authenticator, **kwargs) -> None:
    audit.record_removed(user=user, authenticator=authenticator)


@receiver(mfa_signals.authenticator_reset, dispatch_uid="accounts.mfa_reset")
def _mfa_reset(sender, request, user, authenticator, **kwargs) -> None:
    audit.record_reset(user=user, authenticator=authenticator)


@receiver(mfa_signals.authenticator_used, dispatch_uid="accounts.mfa_used")
def _mfa_used(sender, request, user, authenticator, **kwargs) -> None:
    audit.record_used(user=user, authenticator=authenticator)


@receiver(mfa_signals.authentication_failed, dispatch_uid="accounts.mfa_failed")
def _mfa_failed(sender, request, user, authenticator, reauthentication=False, **kwargs) -> None:
    audit.record_failed(
        user=user, authenticator=authenticator, reauthentication=bool(reauthentication)
    )
