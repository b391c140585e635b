"""The browser sessions' store (SESSION_ENGINE): Django's database store, its read of a session
written once on PostgreSQL.

Every signed-in request reads its session row before anything else: the ORM's get() costs
about twice the Python of the same read sent as written once (core.statements), 0.9 against
0.31 to 0.36 ms on the bench's host, on each page, decision and live socket. Everything else
(creating, saving, deleting, expiry, the row's encoding) is Django's database store unchanged,
as is the read on SQLite. The read's answers are Django's: the unexpired row of the session's
key; an unknown or expired key reads as no session, its key forgotten so that what is stored
next gets a new one.
"""

from __future__ import annotations

import logging

from django.contrib.sessions.backends import db
from django.core.exceptions import SuspiciousOperation
from django.db import connections, router
from django.utils import timezone

from approvals.core import statements


def _live_session(values):
    """The session row of a key while it has not expired (Django's database store's read)."""
    return SessionStore.get_model_class().objects.filter(
        session_key=values["key"], expire_date__gt=values["now"]
    )


class SessionStore(db.SessionStore):
    def _get_session_from_db(self):
        if connections[router.db_for_read(self.model)].vendor != "postgresql":
            # On SQLite the ORM sends a time as text, which is not written once: Django's read.
            return super()._get_session_from_db()
        try:
            return statements.get(
                "session_store.load",
                _live_session,
                {"key": self.session_key, "now": timezone.now()},
            )
        except (self.model.DoesNotExist, SuspiciousOperation) as error:
            # As Django's store: a suspicious key is logged, and either way there is no session.
            if isinstance(error, SuspiciousOperation):
                logging.getLogger(f"django.security.{type(error).__name__}").warning(str(error))
            self._session_key = None
            return None
