"""Statements written once per shape (core.statements): the ORM's SQL, sent with each call's
values, and compared with the ORM's own when checking is on (as in the whole suite)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from approvals.core import statements
from approvals.core.statements import StatementDrift
from approvals.models import Ticket

pytestmark = [
    pytest.mark.django_db,
    # Only PostgreSQL's statements are written once (decide's compare-and-set); on SQLite the
    # ORM turns a time into text, which the module refuses as a value it cannot mark.
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="statements written once are PostgreSQL's"
    ),
]

NOW = datetime(2026, 12, 6, 9, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    statements.forget()
    yield
    statements.forget()


def _ticket_read(values):
    """A ticket's expiry check with a message filter: an int, a time and a string."""
    query = Ticket.objects.filter(
        pk=values["ticket"], expires_at__gt=values["now"], decision_message=values["message"]
    ).query
    return query.get_compiler(connection.alias).as_sql()


class Counted:
    def __init__(self, build):
        self.build, self.calls = build, 0

    def __call__(self, values):
        self.calls += 1
        return self.build(values)


def test_a_statement_is_written_once_and_sent_with_each_calls_values(monkeypatch):
    monkeypatch.setattr(statements, "CHECKING", False)
    build = Counted(_ticket_read)
    calls = [
        {"ticket": 7, "now": NOW, "message": "ship it"},
        {"ticket": 8, "now": NOW + timedelta(minutes=1), "message": ""},
        {"ticket": 7, "now": NOW, "message": "it's \x00-free; 'quoted'"},
    ]

    sent = [statements.statement(("test", "read"), build, values) for values in calls]

    assert build.calls == 1
    for (sql, params), values in zip(sent, calls, strict=True):
        expected_sql, expected_params = _ticket_read(values)
        assert sql == expected_sql
        assert params == tuple(expected_params)
        assert [type(p) for p in params] == [type(p) for p in expected_params]


def test_two_keys_are_two_statements(monkeypatch):
    monkeypatch.setattr(statements, "CHECKING", False)
    build = Counted(_ticket_read)
    values = {"ticket": 7, "now": NOW, "message": ""}

    statements.statement(("test", "one"), build, values)
    statements.statement(("test", "two"), build, values)
    statements.statement(("test", "one"), build, values)

    assert build.calls == 2


def test_a_value_the_orm_changes_is_refused_when_the_statement_is_written(monkeypatch):
    monkeypatch.setattr(statements, "CHECKING", False)

    def shouting(values):
        return _ticket_read({**values, "message": values["message"].upper()})

    with pytest.raises(StatementDrift, match=r"\['message'\] are not parameters"):
        statements.statement(
            ("test", "shouting"), shouting, {"ticket": 1, "now": NOW, "message": "x"}
        )


def test_checking_catches_a_shape_left_out_of_the_key():
    # Whether the message is filtered on changes the statement, but the key does not say so.
    def build(values):
        if values["message"] == "":
            return _ticket_read({**values, "message": "unused"})[0].replace(
                ' AND "approvals_ticket"."decision_message" = %s', ""
            ), _ticket_read(values)[1][:-1]
        return _ticket_read(values)

    statements.statement(("test", "shape"), build, {"ticket": 1, "now": NOW, "message": "x"})
    with pytest.raises(StatementDrift, match="drifted from the ORM's"):
        statements.statement(("test", "shape"), build, {"ticket": 1, "now": NOW, "message": ""})


@pytest.mark.parametrize("value", [True, None, 1.5, b"bytes"])
def test_flags_nulls_and_other_types_are_no_values(value):
    with pytest.raises(TypeError):
        statements.statement(("test", "type"), _ticket_read, {"ticket": value})
