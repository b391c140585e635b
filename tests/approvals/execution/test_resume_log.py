"""The resume task's log line says what became of the run: the queue's own line says only that
the task ran (SUCCESSFUL, even for a run that failed)."""

from __future__ import annotations

import logging

import pytest

from approvals.decisions.decide import decide
from approvals.execution.queue import resume_run_task
from approvals.models import Role, Run, RunStatus, Ticket
from tests.support import TenantFactory, member, paused_run

# The resume runs the agent's tools in another thread, so the data must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def decided(request):
    """A paused demo run whose one call ann decided (approve: the parameter)."""
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, "req"))
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=member(tenant, Role.APPROVER, "ann"), approve=request.param, message="no")
    return run


def _lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "approvals.worker"]


@pytest.mark.parametrize("decided", [False], indirect=True)
def test_resume_log_a_rejected_run_says_rejected_and_completed(decided, caplog):
    caplog.set_level(logging.INFO, logger="approvals.worker")

    assert resume_run_task.call(decided.pk) == RunStatus.COMPLETED

    assert _lines(caplog) == [
        (logging.INFO, f"run {decided.pk}: completed (deploy_release rejected by ann)")
    ]


@pytest.mark.parametrize("decided", [True], indirect=True)
def test_resume_log_a_run_that_could_not_resume_is_a_warning_with_the_reason(decided, caplog):
    Run.objects.filter(pk=decided.pk).update(agent_version="9")
    caplog.set_level(logging.INFO, logger="approvals.worker")

    status = resume_run_task.call(decided.pk)

    decided.refresh_from_db()
    assert (status, decided.status) == (RunStatus.NEEDS_ATTENTION, RunStatus.NEEDS_ATTENTION)
    assert _lines(caplog) == [
        (
            logging.WARNING,
            f"run {decided.pk}: needs_attention (deploy_release approved by ann): "
            f"{decided.status_reason}",
        )
    ]


@pytest.mark.parametrize("decided", [True], indirect=True)
def test_resume_log_a_second_delivery_says_it_did_nothing(decided, caplog):
    resume_run_task.call(decided.pk)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="approvals.worker")

    assert resume_run_task.call(decided.pk) == RunStatus.COMPLETED

    assert _lines(caplog) == [
        (
            logging.INFO,
            f"run {decided.pk}: completed (deploy_release approved by ann): "
            "not claimed: another delivery has it",
        )
    ]
