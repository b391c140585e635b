"""Ending a user's sessions (allauth.usersessions): used when a tenant starts requiring single
sign-on, so sessions signed in otherwise do not outlive the rule."""

from __future__ import annotations

from collections.abc import Callable

from allauth.account.internal.flows.login import AUTHENTICATION_METHODS_SESSION_KEY
from allauth.usersessions.models import UserSession
from django.db import transaction

from approvals.audit import chain
from approvals.models import Membership


def end_sessions(
    user,
    *,
    keep_session_key: str | None = None,
    keep: Callable[[list[dict]], bool] | None = None,
    actor=None,
    reason: str = "",
) -> int:
    """End the user's sessions but the one with keep_session_key and those whose sign-in
    methods (allauth's list of {"method", "provider", ...}) keep() accepts.

    Side effects: each session ended (UserSession.end: the session is deleted, the user is out
    at their next request) and, when any was, auth.sessions_ended (sessions, user, reason) in
    each tenant of the user. Returns how many were ended.
    """
    ended = 0
    for user_session in UserSession.objects.filter(user=user):
        if keep_session_key and user_session.session_key == keep_session_key:
            continue
        if keep is not None:
            store = user_session._session_store(user_session.session_key)
            methods = store.get(AUTHENTICATION_METHODS_SESSION_KEY) or []
            if keep(methods):
                continue
        user_session.end()
        ended += 1
    if ended:
        for tenant_id in Membership.objects.filter(user=user).values_list("tenant_id", flat=True):
            with transaction.atomic():
                chain.append(
                    tenant_id=tenant_id,
                    action="auth.sessions_ended",
                    actor=actor,
                    outcome="ended",
                    detail={"sessions": ended, "user": user.get_username(), "reason": reason},
                )
    return ended
