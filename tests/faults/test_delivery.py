"""At-least-once delivery at scale: one approved resume delivered 2, 5 and 20 times, to 2 and to
4 `manage.py db_worker --batch` processes started together (PostgreSQL).

tests/approvals/runs/test_workers.py covers two deliveries to two workers; here the duplicates are
many and interleaved with other runs' duplicates. Expected for every run: one effect, one claim
(attempts 1, one run.resuming), one done ledger row, completed, and every delivery of it
finishes SUCCESSFUL (the late ones find the run claimed or already completed).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain as audit
from approvals.decisions.decide import decide
from approvals.execution.queue import resume_run_task
from approvals.models import AuditEvent, IdempotencyRecord, LedgerStatus, Run, RunStatus, Ticket
from devtools import demo
from tests.conftest import subprocess_env
from tests.faults.conftest import require_postgres
from tests.support import TenantFactory, member, paused_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]

DELIVERIES = (2, 5, 20)
RESUME_TASK = "approvals.execution.queue.resume_run_task"


def _release(deliveries: int) -> str:
    return f"2026.07.{deliveries:02d}"


@pytest.mark.parametrize("workers", [2, 4])
def test_one_resume_delivered_2_5_and_20_times_to_several_workers_runs_once(
    workers, manage_process
):
    require_postgres(
        "concurrent workers: row locks and SKIP LOCKED; select_for_update is a no-op on SQLite"
    )
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, "viewer", username="dev-rita")
    approver = member(tenant, "approver", username="rm-alice")
    runs: dict[int, Run] = {}
    for deliveries in DELIVERIES:
        run = paused_run(
            tenant,
            requested_by=requester,
            prompt=f"Deploy release {_release(deliveries)} to production",
        )
        # The decision enqueues the first delivery; the others are duplicates of it.
        decide(Ticket.objects.get(run=run), user=approver, approve=True)
        runs[deliveries] = run
    # Interleave the duplicates so that the workers see them mixed, as a redelivering queue would.
    for round_ in range(max(DELIVERIES)):
        for deliveries, run in runs.items():
            if round_ < deliveries - 1:
                resume_run_task.enqueue(run.pk)
    tasks = DBTaskResult.objects.filter(task_path=RESUME_TASK)
    assert tasks.count() == sum(DELIVERIES)
    assert demo.read_effects() == []

    started = time.monotonic()
    processes = [
        manage_process(
            "db_worker",
            "--batch",
            "--no-startup-delay",
            "--worker-id",
            f"w{index}",
            env=subprocess_env(),
        )
        for index in range(workers)
    ]
    outcomes = [(p.pid, *p.communicate(timeout=120)) for p in processes]
    elapsed = time.monotonic() - started

    assert [p.returncode for p in processes] == [0] * workers, [err for _, _, err in outcomes]
    effects = demo.read_effects("deploy_release")
    by_worker: dict[str, int] = {}
    for task in tasks:
        assert task.status == "SUCCESSFUL", (task.status, task.traceback)
        for worker_id in task.worker_ids:
            by_worker[worker_id] = by_worker.get(worker_id, 0) + 1
    for deliveries, run in runs.items():
        run.refresh_from_db()
        mine = [e for e in effects if e["release"] == _release(deliveries)]
        assert len(mine) == 1, (deliveries, mine)
        assert run.status == RunStatus.COMPLETED, (deliveries, run.status, run.status_reason)
        assert run.attempts == 1, deliveries
        actions = list(AuditEvent.objects.filter(run_id=run.pk).values_list("action", flat=True))
        assert actions.count("run.resuming") == 1, deliveries
        assert actions.count("effect.done") == 1, deliveries
        assert list(IdempotencyRecord.objects.filter(run=run).values_list("status", flat=True)) == [
            LedgerStatus.DONE
        ]
        delivered = [t for t in tasks if t.args_kwargs["args"] == [run.pk]]
        assert len(delivered) == deliveries
    assert len(effects) == len(DELIVERIES)
    assert audit.verify_chain(tenant).ok
    print(
        f"\n[faults] {workers} workers, {sum(DELIVERIES)} deliveries of {len(runs)} runs: "
        f"{len(effects)} effects, task outcomes {dict(Counter(t.return_value for t in tasks))}, "
        f"tasks per worker {dict(sorted(by_worker.items()))}, "
        f"effects by pid {sorted(e['pid'] for e in effects)}, wall {elapsed:.1f}s"
    )
