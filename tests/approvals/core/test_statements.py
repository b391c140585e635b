"""Statements written once per shape (core.statements): the ORM's SQL, sent with each call's
values, and compared with the ORM's own when checking is on (as in the whole suite)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError

from approvals import members
from approvals.core import statements
from approvals.core.statements import StatementDrift
from approvals.models import Membership, Role, Run, Ticket, TicketStatus
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

# Decide's compare-and-set, with a time among its values, is written once on PostgreSQL only: on
# SQLite the ORM turns a time into text, which the module refuses as a value it cannot mark.
with_times = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a time is a value on PostgreSQL only"
)

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


@with_times
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


@with_times
def test_two_keys_are_two_statements(monkeypatch):
    monkeypatch.setattr(statements, "CHECKING", False)
    build = Counted(_ticket_read)
    values = {"ticket": 7, "now": NOW, "message": ""}

    statements.statement(("test", "one"), build, values)
    statements.statement(("test", "two"), build, values)
    statements.statement(("test", "one"), build, values)

    assert build.calls == 2


@with_times
def test_a_value_the_orm_changes_is_refused_when_the_statement_is_written(monkeypatch):
    monkeypatch.setattr(statements, "CHECKING", False)

    def shouting(values):
        return _ticket_read({**values, "message": values["message"].upper()})

    with pytest.raises(StatementDrift, match=r"\['message'\] are not parameters"):
        statements.statement(
            ("test", "shouting"), shouting, {"ticket": 1, "now": NOW, "message": "x"}
        )


@with_times
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


@pytest.mark.parametrize("value", [True, None, 1.5, bytearray(b"mutable")])
def test_flags_nulls_and_other_types_are_no_values(value):
    with pytest.raises(TypeError):
        statements.statement(("test", "type"), _ticket_read, {"ticket": value})


# --- model objects read once per shape ----------------------------------------------------------


def _tickets_of_run(values):
    return (
        Ticket.objects.select_related("run", "tenant").filter(run_id=values["run"]).order_by("pk")
    )


@pytest.fixture
def two_runs():
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, Role.VIEWER, "req")
    return [paused_run(tenant, requested_by=requester) for _ in range(2)]


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_objects_are_the_orms_with_their_related_rows(two_runs, django_assert_num_queries):
    for run in two_runs:
        with django_assert_num_queries(1):
            read = statements.objects("test.tickets", _tickets_of_run, {"run": run.pk})
            # Read with the row: no query for the run or the tenant.
            related = [(t.run.title, t.tenant.slug) for t in read]
        orm = list(_tickets_of_run({"run": run.pk}))
        assert [_fields(t) for t in read] == [_fields(t) for t in orm]
        assert [_fields(t.run) for t in read] == [_fields(t.run) for t in orm]
        assert related == [(run.title, "acme")] * len(orm)
        assert all(t._state.db == "default" and not t._state.adding for t in read)


def test_a_reads_converters_are_found_once_per_connection(two_runs, monkeypatch):
    """How a read's rows become objects (its columns' converters, its select_related
    populators) is found on a connection's first read and kept: the objects stay the ORM's."""
    from django.db.models.sql.compiler import SQLCompiler

    found = []
    original = SQLCompiler.get_converters

    def get_converters(self, expressions):
        found.append(len(expressions))
        return original(self, expressions)

    monkeypatch.setattr(SQLCompiler, "get_converters", get_converters)
    first = statements.objects("test.tickets", _tickets_of_run, {"run": two_runs[0].pk})
    second = statements.objects("test.tickets", _tickets_of_run, {"run": two_runs[1].pk})

    assert len(found) == 1
    for run, read in zip(two_runs, (first, second), strict=True):
        orm = list(_tickets_of_run({"run": run.pk}))
        assert [_fields(t) for t in read] == [_fields(t) for t in orm]
        assert [_fields(t.run) for t in read] == [_fields(t.run) for t in orm]


def test_get_is_the_one_object_else_the_models_errors(two_runs):
    ticket = Ticket.objects.filter(run=two_runs[0]).get()

    def by_status(values):
        return Ticket.objects.filter(tenant_id=values["tenant"], status=TicketStatus.PENDING)

    def by_pk(values):
        return Ticket.objects.filter(pk=values["ticket"])

    assert statements.get("test.by_pk", by_pk, {"ticket": ticket.pk}).pk == ticket.pk
    with pytest.raises(Ticket.DoesNotExist):
        statements.get("test.by_pk", by_pk, {"ticket": ticket.pk + 1000})
    with pytest.raises(Ticket.MultipleObjectsReturned):
        statements.get("test.by_status", by_status, {"tenant": ticket.tenant_id})


@pytest.mark.parametrize("forged", [2**63, -(2**63) - 1, 10**30])
def test_an_integer_beyond_every_column_reads_nothing_and_sends_nothing(
    two_runs, forged, django_assert_num_queries
):
    # Written first with a value in range.
    statements.objects("test.tickets", _tickets_of_run, {"run": two_runs[0].pk})

    with django_assert_num_queries(0):
        assert statements.objects("test.tickets", _tickets_of_run, {"run": forged}) == []
        with pytest.raises(Ticket.DoesNotExist):
            statements.get("test.tickets", _tickets_of_run, {"run": forged})


def test_only_plain_model_querysets_are_read_once(two_runs):
    def prefetching(values):
        return Membership.objects.filter(user_id=values["user"]).prefetch_related("tenant")

    def as_values(values):
        return Membership.objects.filter(user_id=values["user"]).values("role")

    for build in (prefetching, as_values):
        with pytest.raises(TypeError, match="only a queryset of model objects"):
            statements.objects(("test", build.__name__), build, {"user": 1})


# Outside the test's own transaction, as the check is about autocommit.
@pytest.mark.django_db(transaction=True)
def test_a_locking_read_outside_a_transaction_is_refused_as_the_orm_refuses_it(two_runs):
    def locked(values):
        return Ticket.objects.select_for_update().filter(run_id=values["run"])

    with transaction.atomic():
        assert len(statements.objects("test.locked", locked, {"run": two_runs[0].pk})) == 1
    # Written already: the check does not depend on the ORM compiling it again.
    with pytest.raises(TransactionManagementError):
        statements.objects("test.locked", locked, {"run": two_runs[0].pk})


def test_annotations_come_with_the_objects_as_the_orm_sets_them(two_runs):
    run = two_runs[0]
    other = TenantFactory(slug="other")

    def with_role(values):
        # A value inside the annotation's subquery is a value like any other.
        return (
            Ticket.objects.filter(run_id=values["run"])
            .select_related("requested_by")
            .annotate(requester_role=members.role_in(values["tenant"], "requested_by_id"))
        )

    for tenant_id, role in ((run.tenant_id, Role.VIEWER), (other.pk, None)):
        values = {"run": run.pk, "tenant": tenant_id}
        read = statements.objects("test.with_role", with_role, values)
        orm = list(with_role(values))
        assert [(t.pk, t.requester_role) for t in read] == [(t.pk, t.requester_role) for t in orm]
        assert [t.requester_role for t in read] == [role] * len(orm)
        assert [t.requested_by.username for t in read] == ["req"] * len(orm)


def test_extra_selects_are_not_read_once():
    def extra(values):
        return Membership.objects.filter(user_id=values["user"]).extra(select={"one": "1"})

    with pytest.raises(TypeError, match="without prefetches or extra"):
        statements.objects("test.extra", extra, {"user": 1})


@with_times
def test_a_statement_refuses_an_integer_no_column_holds(monkeypatch):
    monkeypatch.setattr(statements, "CHECKING", False)
    values = {"ticket": 7, "now": NOW, "message": ""}
    statements.statement(("test", "read"), _ticket_read, values)

    with pytest.raises(ValueError, match="out of its column's range"):
        statements.statement(("test", "read"), _ticket_read, {**values, "ticket": 2**63})


def test_a_returned_row_is_the_object_the_orm_reads(two_runs):
    run = two_runs[0]
    Run.objects.filter(pk=run.pk).update(status_reason="why", final_output='{"json": "text"}')
    columns = statements.returning(Run, using="default")
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE approvals_run SET attempts = attempts + 1 WHERE id = %s RETURNING {columns}",
            [run.pk],
        )
        row = cursor.fetchone()
    returned = statements.row_object(Run, row, using="default")
    assert _fields(returned) == _fields(Run.objects.get(pk=run.pk))
    # Times are read as times on every backend (SQLite returns text), and the row is saved.
    assert returned.created_at.tzinfo is not None and returned.attempts == run.attempts + 1
    assert returned._state.db == "default" and not returned._state.adding


# --- bytes, and one new object inserted ---------------------------------------------------------


def _nonce_set(values):
    from approvals import transitions

    return transitions.update_statement(
        Run.objects.filter(pk=values["run"]), state_nonce=values["nonce"]
    )


def test_bytes_are_values_wrapped_as_the_orm_wraps_them(two_runs):
    # Checking is on: each call is compared with the ORM's statement, wrapper type included.
    build = Counted(_nonce_set)
    run = two_runs[0]
    for nonce in (b"\x00" * 12, b"", bytes(range(12))):
        sql, params = statements.statement("test.nonce", build, {"run": run.pk, "nonce": nonce})
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        run.refresh_from_db()
        assert bytes(run.state_nonce) == nonce
    assert build.calls == 1 + 3 * statements.CHECKING


def _new_ticket(run, **fields) -> Ticket:
    return Ticket(
        run=run,
        tenant_id=run.tenant_id,
        generation=1,
        tool_name="deploy_release",
        tool_call_id=fields.pop("call_id", "call_x"),
        arguments_json='{"release": "r"}',
        arguments_digest="0" * 64,
        created_at=NOW,
        expires_at=NOW + timedelta(hours=1),
        **fields,
    )


def test_one_new_object_is_inserted_as_bulk_create_inserts_it(two_runs, django_assert_num_queries):
    run, requester = two_runs[0], two_runs[0].requested_by
    made = [
        _new_ticket(run, call_id="call_a", requested_by=requester),
        _new_ticket(run, call_id="call_b", requested_by=requester, always=True),
        _new_ticket(run, call_id="call_c"),
    ]
    for ticket in made:
        with django_assert_num_queries(1):
            (created,) = statements.bulk_create("test.ticket", [ticket])
        assert created is ticket and ticket.pk is not None
        assert ticket._state.db == "default" and not ticket._state.adding
        assert _fields(Ticket.objects.get(pk=ticket.pk)) == _fields(ticket)
    if connection.vendor == "postgresql":
        # A flag and a NULL are the statement's shape: three shapes, three statements.
        written = [key for key in statements._written if key[:2] == ("bulk_create", "test.ticket")]
        assert len(written) == 3
        statements.bulk_create("test.ticket", [_new_ticket(run, call_id="call_d")])
        written_again = [
            key for key in statements._written if key[:2] == ("bulk_create", "test.ticket")
        ]
        assert written_again == written


def test_several_new_objects_are_bulk_created(two_runs, django_assert_num_queries):
    run = two_runs[0]
    made = [_new_ticket(run, call_id=f"call_{n}") for n in range(3)]
    with django_assert_num_queries(1):
        created = statements.bulk_create("test.tickets", made)
    assert [t.pk for t in created] == sorted(t.pk for t in created)
    assert Ticket.objects.filter(pk__in=[t.pk for t in created]).count() == 3
    assert statements.bulk_create("test.tickets", []) == []
