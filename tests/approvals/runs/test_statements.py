"""How many statements the worker's resume and a pause send: pinned, so that they cannot creep
back (docs/PERFORMANCE.md). Counted on every thread: the tools' ledger writes too."""

from __future__ import annotations

import pytest
from django.db import connection

from approvals.decisions.decide import decide
from approvals.execution import workers
from approvals.models import Role, Run, RunStatus, Ticket, TicketStatus
from approvals.runs import lease
from approvals.runs.pause import pause_run
from approvals.runs.resume import resume
from devtools.bench import queries
from tests.support import TenantFactory, member, paused_run, run_agent, two_call_agent

# The resume runs the agent's tools in another thread, so the data must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


def _decided(tenant):
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, "req"))
    decide(Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER, "ann"), approve=True)
    return run


def _pause(result, tenant, requester):
    return pause_run(
        result, tenant=tenant, agent_key="release", agent_version="1", requested_by=requester
    )


def test_statements_of_a_resume_that_completes():
    tenant = TenantFactory(slug="acme")
    # The first resume of the process reads what later ones find cached.
    resume(run_id=_decided(tenant).pk, worker_id="w")
    run = _decided(tenant)

    with queries.counting() as counts:
        outcome = resume(run_id=run.pk, worker_id="w")

    assert outcome.status == RunStatus.COMPLETED
    # The worker: the claim (its UPDATE ... RETURNING, which takes the audit head's lock on
    # PostgreSQL, and its audit event), the tickets with their valid votes and each voter's
    # membership (one query), the outcome (on PostgreSQL one statement moves the run,
    # supersedes its pending tickets, takes the tenant's lock, in the order run, tickets,
    # tenant, as a decision takes them, and writes its audit event: the head is where this
    # process last saw it, after the tool's event). The tool: the ledger's claim, and its
    # confirmation with the head's lock and its audit event (one statement: the head is where
    # the claim left it).
    # On SQLite each transaction is a BEGIN IMMEDIATE statement and an append is three.
    expected = {"postgresql": (4, 2), "sqlite": (12, 6)}[connection.vendor]
    assert (counts["main"], counts["other"]) == expected, counts.log
    # Transactions: on PostgreSQL the claim's alone. The confirmation and the outcome, each one
    # statement with its event, commit on their own (autocommit): no BEGIN, no COMMIT. On
    # SQLite the claim, the confirmation and the outcome.
    assert counts["commits"] == {"postgresql": 1, "sqlite": 3}[connection.vendor]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the claim's hint")
def test_statements_of_a_resume_whose_task_s_claim_read_the_run():
    """As the worker resumes: its task's claim read the run's tenant and attempts, so the run's
    claim and its event go as one statement, without a transaction."""
    tenant = TenantFactory(slug="acme")
    resume(run_id=_decided(tenant).pk, worker_id="w")
    run = _decided(tenant)

    with (
        queries.counting() as counts,
        workers.hinted(workers.RunHint(run.pk, tenant.pk, run.attempts)),
    ):
        outcome = resume(run_id=run.pk, worker_id="w")

    assert outcome.status == RunStatus.COMPLETED
    # The claim with its event, the tickets, the outcome; the tool's two.
    assert (counts["main"], counts["other"]) == (3, 2), counts.log
    assert counts["commits"] == 0


def test_statements_of_a_pause():
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, Role.VIEWER, "req")
    result = run_agent("release", "Deploy release 2026.07.24 to production")
    _pause(result, tenant, requester)

    with queries.counting() as counts:
        _pause(result, tenant, requester)

    # The run: on PostgreSQL its id read ahead, then its row born paused with its sealed state
    # in one INSERT that takes the tenant's audit-head lock too; on SQLite created, then sealed
    # and moved to paused. Then the policy, the ticket, then the run's audit event and the
    # ticket's (on PostgreSQL both in one statement with their head as the transaction ends; on
    # SQLite each append is three statements).
    expected = {"postgresql": 5, "sqlite": 11}[connection.vendor]
    assert counts["main"] + counts["other"] == expected, counts.log
    run_writes = [
        sql
        for _, sql in counts.log
        if '"approvals_run"' in sql.split("RETURNING")[0] or "nextval" in sql
    ]
    if connection.vendor == "postgresql":
        # Written once: no UPDATE of the row it has just inserted.
        assert [sql.split(" ", 1)[0] for sql in run_writes] == ["SELECT", "WITH"], run_writes
        assert "nextval" in run_writes[0] and "INSERT INTO" in run_writes[1], run_writes


def test_a_pause_of_two_calls_costs_what_a_pause_of_one_costs():
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, Role.VIEWER, "req")
    one = run_agent("release", "Deploy release 2026.07.24 to production")
    two = run_agent(
        "release", "Deploy release 2026.07.24 to staging and production", agent=two_call_agent()
    )
    _pause(one, tenant, requester)

    def statements(result) -> int:
        with queries.counting() as counts:
            _pause(result, tenant, requester)
        return counts["main"] + counts["other"]

    # The policies of every call in one query and every ticket in one statement; on PostgreSQL
    # every audit event in one statement too. On SQLite each event is three statements.
    assert len(two.interruptions) == 2
    extra = {"postgresql": 0, "sqlite": 3}[connection.vendor]
    assert statements(two) == statements(one) + extra
    assert Ticket.objects.filter(run__tenant=tenant).count() == 1 + 1 + 2


def _decider_after_a_first_decision(tenant):
    """An approver and a requester, after the process's first decision, which reads what later
    ones find cached."""
    approver = member(tenant, Role.APPROVER, "ann")
    requester = member(tenant, Role.VIEWER, "req")
    decide(
        Ticket.objects.get(run=paused_run(tenant, requested_by=requester)),
        user=approver,
        approve=True,
    )
    return approver, requester


def test_statements_of_a_decision_that_queues_its_run():
    tenant = TenantFactory(slug="acme")
    approver, requester = _decider_after_a_first_decision(tenant)
    ticket = Ticket.objects.get(run=paused_run(tenant, requested_by=requester))

    with queries.counting() as counts:
        decide(ticket, user=approver, approve=True)

    ticket.run.refresh_from_db()
    assert ticket.run.status == RunStatus.QUEUED
    # Before the lock: the decider's membership with its tenant (one query), the run (the digest gate opens
    # its state). Under the run's lock: the run, the ticket with its policy, the valid votes,
    # the vote, the compare-and-set and the run queued when no other ticket of its state is
    # pending (on PostgreSQL one statement, with the audit head's lock; on SQLite two), its
    # task (whose insert NOTIFYs the workers on PostgreSQL); the decision's audit event and
    # the run's (on PostgreSQL both in one statement with their head as the transaction ends).
    # On SQLite an append is three statements.
    expected = {"postgresql": 9, "sqlite": 16}[connection.vendor]
    assert counts["main"] + counts["other"] == expected, counts.log


def test_statements_of_a_decision_on_a_run_that_is_not_paused():
    tenant = TenantFactory(slug="acme")
    approver, requester = _decider_after_a_first_decision(tenant)
    run = paused_run(tenant, requested_by=requester)
    # Parked by the worker meanwhile: a decision still records, and moves no run.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.NEEDS_ATTENTION)
    ticket = Ticket.objects.get(run=run)

    with queries.counting() as counts:
        decide(ticket, user=approver, approve=True)

    assert Run.objects.get(pk=run.pk).status == RunStatus.NEEDS_ATTENTION
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED
    # As a decision that queues its run, less the run's move and its task: the compare-and-set
    # of the ticket alone (with the audit head's lock on PostgreSQL), then its audit event.
    expected = {"postgresql": 8, "sqlite": 11}[connection.vendor]
    assert counts["main"] + counts["other"] == expected, counts.log


def test_statements_of_a_release():
    tenant = TenantFactory(slug="acme")
    run = _decided(tenant)
    claimed = lease.claim(run.pk, "w", lease.RESUME)

    with queries.counting() as counts:
        assert lease.release(claimed, reason="the session store is down")

    # The run given back (with the audit head's lock on PostgreSQL) and its audit event.
    expected = {"postgresql": 2, "sqlite": 5}[connection.vendor]
    assert counts["main"] + counts["other"] == expected, counts.log


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's prepared statements (config.env)"
)
def test_a_statement_a_connection_runs_again_is_run_from_its_prepared_plan():
    tenant = TenantFactory(slug="acme")

    # A statement of its own shape, which no earlier test ran on this connection.
    def read_titles() -> list[str]:
        return list(
            Run.objects.filter(tenant=tenant, title="prepared?").values_list("title", flat=True)
        )

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
                ['SELECT "approvals_run"."title" AS "title" FROM "approvals_run" WHERE%'],
            )
            return [row[0] for row in cursor.fetchall()]

    read_titles()
    assert prepared() == []
    read_titles()

    # Bound by the server ($1, $2), and prepared the second time.
    [statement] = prepared()
    assert statement.endswith(
        'WHERE ("approvals_run"."tenant_id" = $1 AND "approvals_run"."title" = $2)'
    )
