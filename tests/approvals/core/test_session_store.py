"""The browser sessions' store (core.session_store): Django's database store, its read of a
session written once (core.statements), with the same answers."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.sessions.backends import db
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.core import statements
from approvals.core.session_store import SessionStore
from approvals.models import Role
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh():
    statements.forget()
    yield
    statements.forget()


def _saved(**data) -> str:
    store = SessionStore()
    store.update(data)
    store.save()
    return store.session_key


def test_a_live_session_is_read_in_one_statement_with_its_data():
    key = _saved(colour="teal", count=3)
    for _ in range(2):  # written on the first read, sent as written on the second
        store = SessionStore(key)
        with CaptureQueriesContext(connection) as queries:
            data = store.load()
        assert data == {"colour": "teal", "count": 3}
        assert len(queries) == 1
        assert queries[0]["sql"].startswith(f'SELECT "{Session._meta.db_table}"')
        if connection.vendor == "postgresql":
            # The read went through core.statements (which, checking, compared it with the ORM's).
            assert ("get", ("session_store.load", Session)) in statements._written
        assert store.session_key == key


def test_it_sends_the_read_django_s_own_store_sends():
    key = _saved(colour="teal")
    sent = []
    for store_class in (db.SessionStore, SessionStore, SessionStore):
        with CaptureQueriesContext(connection) as queries:
            assert store_class(key).load() == {"colour": "teal"}
        (query,) = queries
        # The same statement but for the time it was sent at.
        sent.append(re.sub(r"'?\d{4}-\d\d-\d\d[ T][\d:.+]+'?", "NOW", query["sql"]))
    assert sent[1] == sent[0]
    assert sent[2] == sent[0]
    assert "NOW" in sent[0]


def test_no_key_or_one_too_short_to_be_kept_reads_as_none_without_a_query():
    _saved(colour="teal")
    for key in (None, "short"):
        store = SessionStore(key)
        with CaptureQueriesContext(connection) as queries:
            assert store.load() == {}
        assert len(queries) == 0
        assert store.session_key is None


def test_an_expired_session_reads_as_none_and_its_key_is_forgotten():
    key = _saved(colour="teal")
    Session.objects.filter(session_key=key).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )
    store = SessionStore(key)
    assert store.load() == {}
    assert store.session_key is None
    # What is stored next goes under a new key, never the expired one.
    store["colour"] = "red"
    store.save()
    assert store.session_key not in (None, key)
    assert Session.objects.filter(session_key=key).count() == 1


def test_an_unknown_key_reads_as_none():
    _saved(colour="teal")
    store = SessionStore("x" * 32)
    assert store.load() == {}
    assert store.session_key is None


def test_the_console_signs_requests_in_and_out_through_it(client):
    assert settings.SESSION_ENGINE == "approvals.core.session_store"
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.APPROVER))
    assert client.get("/").status_code == 200
    # The session expires: the next request is a signed-out one.
    Session.objects.update(expire_date=timezone.now() - timedelta(seconds=1))
    answer = client.get("/")
    assert answer.status_code == 302
    assert answer["Location"].startswith(settings.LOGIN_URL)
