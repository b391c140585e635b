"""Ending a person's sessions: the browser sessions they are signed in with, and the live
sockets those sessions hold open.

Called when a person signs out their other sessions, and by tenancy when a member is removed or
their role changes (so they sign in again and see only what they may now see). Sessions are
allauth's UserSessions (recorded at each sign-in) and, with a database session engine, any
other Django session of the user that allauth never recorded (one made before allauth was
installed, or by a test's force_login): finding those means reading every unexpired session
row, which is fine for this rare operation; with a cache or cookie session engine only the
recorded sessions can be found (and a signed-cookie session cannot be ended by the server).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from importlib import import_module

from allauth.usersessions.models import UserSession
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.audit import chain
from approvals.live import hints
from approvals.models import Membership, Tenant

# Unrecorded sessions are read in batches of this many rows.
_SCAN_CHUNK = 500


def _store_class():
    return import_module(settings.SESSION_ENGINE).SessionStore


def _unrecorded_sessions(user, *, skip: set[str]) -> list[tuple[str, dict]]:
    """Keys and data of the user's unexpired Django sessions that allauth did not record."""
    store_class = _store_class()
    if not hasattr(store_class, "get_model_class"):
        return []
    model = store_class.get_model_class()
    wanted = str(user.pk)
    keys = []
    rows = (
        model.objects.filter(expire_date__gt=timezone.now())
        .exclude(session_key__in=skip)
        .values_list("session_key", "session_data")
    )
    for key, encoded in rows.iterator(chunk_size=_SCAN_CHUNK):
        data = store_class().decode(encoded)
        if str(data.get("_auth_user_id", "")) == wanted:
            keys.append((key, data))
    return keys


def end_sessions(
    *,
    user,
    reason: str,
    actor=None,
    keep_session_key: str | None = None,
    only_session_keys: Collection[str] | None = None,
    tenant: Tenant | None = None,
    keep: Callable[[dict], bool] | None = None,
) -> int:
    """End every session of the user but the one keep_session_key names (or, given
    only_session_keys, just those of the user's recorded sessions), and return how many were
    still signed in. keep, given, is asked about each session's data (a dict): a session it
    accepts stays (accounts.sso keeps those signed in through the tenant's provider).

    reason is the audit's sentence ("signed out the other sessions", "removed from acme");
    actor is who ended them (None for the system). Inside a caller's transaction the sessions
    end with it; the sockets are told only after commit.

    Side effects: deletes the user's allauth UserSessions and their Django sessions, and any
    other unexpired Django session of the user (database session engines); when at least one
    ended, appends auth.sessions_ended (detail: sessions, user, user_id, reason) to the chain
    of each tenant the user belongs to and of tenant when given (the tenant they just left);
    after commit, the user's open sockets whose session ended close (hints.signed_out_on_commit,
    or the audit tail with the in-memory layer).
    Raises: nothing of its own.
    """
    store_class = _store_class()
    with transaction.atomic():
        ended = 0
        seen: set[str] = set()
        if keep_session_key:
            seen.add(keep_session_key)
        recorded = UserSession.objects.filter(user_id=user.pk).exclude(session_key__in=seen)
        if only_session_keys is not None:
            recorded = recorded.filter(session_key__in=list(only_session_keys))
        for session in recorded:
            seen.add(session.session_key)
            if keep is not None and keep(store_class(session.session_key).load()):
                continue
            # A recorded session may already be gone (expired, signed out): not counted.
            if session.exists():
                ended += 1
            session.end()
        unrecorded = [] if only_session_keys is not None else _unrecorded_sessions(user, skip=seen)
        for key, data in unrecorded:
            if keep is not None and keep(data):
                continue
            store_class().delete(key)
            ended += 1
        if not ended:
            return 0
        tenant_ids = set(Membership.objects.filter(user=user).values_list("tenant_id", flat=True))
        if tenant is not None:
            tenant_ids.add(tenant.pk)
        for tenant_id in sorted(tenant_ids):
            chain.append(
                tenant_id=tenant_id,
                action=hints.SESSIONS_ENDED,
                actor=actor,
                outcome="ended",
                detail={
                    "sessions": ended,
                    "user": user.get_username(),
                    "user_id": user.pk,
                    "reason": reason,
                },
            )
        hints.signed_out_on_commit(user.pk)
    return ended
