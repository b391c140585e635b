"""The browser sessions' store (SESSION_ENGINE): Django's database store, its read of a session
written once on PostgreSQL.

Every signed-in request reads its session row before anything else: the ORM's get() costs two
and a half to three times the Python of the same read sent as written once (core.statements),
0.9 against 0.31 to 0.36 ms on the bench's host, on each page, decision and live socket's
connect. Everything else (creating, saving, deleting, expiry, the row's encoding) is Django's
database store unchanged, as are the read on SQLite and the async read (aload, which nothing in
the console calls). The read's answers are Django's: the unexpired row of the session's key; no
key, an unknown or an expired one reads as no session, its key forgotten so that what is stored
next gets a new one.
"""

from __future__ import annotations

import logging

from django.contrib.sessions.backends import db
from django.core.exceptions import SuspiciousOperation
from django.db import connections, router
from django.utils import timezone

from approvals.core import statements


class SessionStore(db.SessionStore):
    def _get_session_from_db(self):
        if self.session_key is None:
            # Django's store keeps no key shorter than it makes (nor none): no row has it.
            return None
        model = self.model
        if connections[router.db_for_read(model)].vendor != "postgresql":
            # On SQLite the ORM sends a time as text, which is not written once: Django's read.
            return super()._get_session_from_db()

        def live(values):
            # The session row of a key while it has not expired: Django's database store's read.
            return model.objects.filter(session_key=values["key"], expire_date__gt=values["now"])

        try:
            return statements.get(
                ("session_store.load", model),
                live,
                {"key": self.session_key, "now": timezone.now()},
            )
        except (model.DoesNotExist, SuspiciousOperation) as error:
            # As Django's store: a SuspiciousOperation the read raises is logged, and either way
            # there is no session.
            if isinstance(error, SuspiciousOperation):
                logging.getLogger(f"django.security.{type(error).__name__}").warning(str(error))
            self._session_key = None
            return None
