"""The worker's two pools: the resume pool's loop, and when the notifications pool's pass is
followed at once by the next and when the next waits as an idle pass does."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django_tasks_db.management.commands import db_worker

from approvals.audit import chain as audit
from approvals.execution import queue, workers
from approvals.management.commands import worker
from approvals.models import Role, Tenant
from notifications.deliveries import deliver_webhook_task
from notifications.models import FanOutCursor
from tests.notifications.conftest import caught_up, make_endpoint
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db


def _pool() -> worker.NotificationsPool:
    return worker.NotificationsPool(
        worker_id="w/notifications-1", interval=0.25, stop=threading.Event(), listen=False
    )


def _escalations(tenant, count: int) -> None:
    for _ in range(count):
        with transaction.atomic():
            audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")


class _Stop(threading.Event):
    """The pool's stop event, keeping each rest the pool takes instead of sleeping it."""

    def __init__(self) -> None:
        super().__init__()
        self.rests: list[float] = []

    def wait(self, timeout=None) -> bool:
        self.rests.append(round(timeout, 6))
        return False


def _run_passes(monkeypatch, pool, passes) -> tuple[list[float], int]:
    """Run the pool's loop over the given passes (each busy or not, or a function saying so),
    then one that stops it: the rests it took, and how many times it waited as when idle."""
    answers = iter(passes)
    pool.stop = _Stop()
    waits = []

    def step():
        answer = next(answers, None)
        if answer is None:
            pool.stop.set()
            return False
        return answer() if callable(answer) else answer

    monkeypatch.setattr(pool, "step", step)
    monkeypatch.setattr(pool, "wait", lambda: waits.append(True))
    pool.run()
    return pool.stop.rests, len(waits)


@pytest.fixture
def tenant():
    tenant = TenantFactory(slug="acme")
    # An endpoint that wants nothing these tests send: the fan-out makes no task.
    make_endpoint(tenant, member(tenant, Role.ADMIN), events=["run.failed"])
    caught_up(tenant)
    return tenant


def test_a_pass_that_fanned_out_a_few_events_is_followed_by_a_wait(tenant):
    _escalations(tenant, 3)

    assert _pool().step() is False

    # The events were fanned out all the same: the cursor is past them.
    tenant.refresh_from_db()
    assert FanOutCursor.objects.get(tenant=tenant).seq == tenant.audit_seq


def test_a_pass_with_nothing_to_do_is_followed_by_a_wait(tenant):
    assert _pool().step() is False


def test_a_pass_that_ran_a_task_is_followed_by_the_next_at_once(tenant, monkeypatch):
    ran = []
    # The task is claimed from the notifications queue; what it would do is not this test's.
    monkeypatch.setattr(
        worker.db_worker.Worker, "run_task", lambda self, task_result: ran.append(task_result)
    )
    deliver_webhook_task.enqueue(12345)

    assert _pool().step() is True
    assert [task_result.args_kwargs["args"] for task_result in ran] == [[12345]]


def test_a_pass_that_found_a_backlog_is_followed_by_the_next_at_once(tenant, monkeypatch):
    monkeypatch.setattr(worker, "FAN_OUT_BACKLOG", 4)
    _escalations(tenant, 4)

    assert _pool().step() is True


def test_the_pool_waits_only_after_a_pass_that_was_not_busy(monkeypatch):
    rests, waits = _run_passes(monkeypatch, _pool(), [True, False, True, True, False])

    # The two idle passes and the one that stops it; no resume pool, so no rest.
    assert (rests, waits) == ([], 3)


# --- the resume pool ------------------------------------------------------------------------


def _resume_pool(**kwargs) -> worker.ResumePool:
    return worker.ResumePool(
        listener=None,
        queue_names=["default"],
        interval=0.01,
        batch=False,
        backend_name="default",
        startup_delay=False,
        worker_id="w",
        excluded_queue_names=[],
        **kwargs,
    )


# The pool closes old connections as it loops, which a test's own transaction does not allow.
@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_runs_each_ready_task_once_and_waits_only_when_there_is_none(
    monkeypatch,
):
    for run_id in (1, 2):
        queue.resume_run_task.enqueue(run_id)
    pool = _resume_pool(max_tasks=3)
    ran, waits = [], []

    def run_task(task_result):
        ran.append(task_result)
        pool._run_tasks += 1  # as the library's run_task counts

    def wait():
        waits.append(len(ran))
        # A third task arrives after the first idle poll.
        queue.resume_run_task.enqueue(3)

    monkeypatch.setattr(pool, "run_task", run_task)
    monkeypatch.setattr(pool, "wait", wait)

    pool.run()

    assert [task_result.args_kwargs["args"] for task_result in ran] == [[1], [2], [3]]
    assert waits == [2]


@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_stops_without_waiting_when_told_to_during_a_task(monkeypatch):
    queue.resume_run_task.enqueue(1)
    pool = _resume_pool(max_tasks=None)
    waits = []

    def run_task(task_result):
        pool.running = False  # a SIGTERM arrived while the task ran

    monkeypatch.setattr(pool, "run_task", run_task)
    monkeypatch.setattr(pool, "wait", lambda: waits.append(True))

    pool.run()

    assert waits == []


@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_claims_as_it_runs_a_task_so_a_sigterm_waits_for_the_claim(monkeypatch):
    pool = _resume_pool(max_tasks=None)
    seen = []

    def claim_next(**kwargs):
        seen.append(pool.running_task)
        # A SIGTERM now: the library's handler exits at once only when no task is running.
        pool.running = False
        return None

    monkeypatch.setattr(worker.workers, "claim_next", claim_next)

    pool.run()

    assert seen == [True]
    assert pool.running_task is False


def _counting_connects(monkeypatch) -> list[int]:
    """Each time the main thread's connection opens (borrows from the pool, checked)."""
    opened = []
    wrapper = connections[DEFAULT_DB_ALIAS]
    connect = wrapper.connect

    def counted():
        opened.append(1)
        connect()

    monkeypatch.setattr(wrapper, "connect", counted)
    return opened


def _run_tasks(monkeypatch, runs, task) -> list[int]:
    """The resume pool run over one task per run id, each given to task(run_id) instead of
    resumed; the run ids in the order they ran."""
    for run_id in runs:
        queue.resume_run_task.enqueue(run_id)
    pool = _resume_pool(max_tasks=len(runs))
    ran = []

    def run_task(task_result):
        (run_id,) = task_result.args_kwargs["args"]
        ran.append(run_id)
        task(run_id)
        pool._run_tasks += 1

    monkeypatch.setattr(pool, "run_task", run_task)
    monkeypatch.setattr(pool, "wait", lambda: pytest.fail("a task was ready"))
    pool.run()
    return ran


def _query(run_id) -> None:
    Tenant.objects.filter(pk=run_id).exists()


@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_keeps_its_connection_from_a_task_to_the_next_claim(monkeypatch):
    opened = _counting_connects(monkeypatch)

    ran = _run_tasks(monkeypatch, [1, 2, 3], _query)

    assert ran == [1, 2, 3]
    # One connection for three claims and their tasks, handed back when the pool stops.
    assert len(opened) == 1
    assert connection.connection is None


@pytest.mark.django_db(transaction=True)
def test_a_task_that_leaves_a_transaction_open_has_its_connection_closed_before_the_next_claim(
    monkeypatch,
):
    opened = _counting_connects(monkeypatch)

    def left_open(run_id) -> None:
        if run_id == 1:
            transaction.set_autocommit(False)
            _query(run_id)

    ran = _run_tasks(monkeypatch, [1, 2], left_open)

    assert ran == [1, 2]
    assert len(opened) == 2
    assert connection.get_autocommit()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server that drops a connection")
@pytest.mark.django_db(transaction=True)
def test_a_kept_connection_the_server_dropped_is_replaced_and_the_claim_sent_again(
    monkeypatch, caplog
):
    opened = _counting_connects(monkeypatch)

    def dropped_by_the_server(run_id) -> None:
        if run_id != 1:
            return
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])

    ran = _run_tasks(monkeypatch, [1, 2], dropped_by_the_server)

    assert ran == [1, 2]
    assert len(opened) == 2
    assert "claiming again on a fresh one" in caplog.text


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the claim's hint")
@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_gives_a_task_s_hint_to_its_run_s_claim_while_it_runs(monkeypatch):
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant)
    queue.resume_run_task.enqueue(run.pk)
    pool = _resume_pool(max_tasks=1)
    seen = []

    def library_run_task(self, task_result):
        seen.append(workers.run_hint(run.pk))
        self._run_tasks += 1

    monkeypatch.setattr(db_worker.Worker, "run_task", library_run_task)
    pool.run()

    head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)
    assert seen == [workers.RunHint(run.pk, tenant.pk, run.attempts, head=head)]
    # Only while the task runs.
    assert workers.run_hint(run.pk) is None


# --- resumes first ----------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_resume_pool_has_work_while_a_task_runs_and_a_moment_after():
    clock = Clock()
    activity = worker.ResumeActivity(clock=clock)
    assert activity.active() is False

    with activity.task():
        clock.now += 30  # a long task is active all along
        assert activity.active() is True

    assert activity.active() is True
    clock.now += worker.ResumeActivity.RECENT_SECONDS - 0.01
    assert activity.active() is True
    clock.now += 0.02
    assert activity.active() is False


def test_a_task_s_end_is_written_before_it_stops_running():
    # A reader between the two writes sees a task that has just ended, never an old one.
    activity = worker.ResumeActivity()
    seen = []

    def clock():
        seen.append(activity.running)
        return 100.0

    activity.clock = clock
    with activity.task():
        pass

    assert seen == [True]
    assert activity.active() is True


def test_the_resume_pool_s_cpu_is_its_own_thread_s():
    activity = worker.ResumeActivity()
    assert activity.cpu() is None  # not attached yet
    attached, done = threading.Event(), threading.Event()

    def resume_thread():
        activity.attach()
        attached.set()
        done.wait()  # waits, as a resume waiting on a model does: no CPU

    thread = threading.Thread(target=resume_thread)
    thread.start()
    attached.wait()
    try:
        before, mine = activity.cpu(), time.thread_time()
        while time.thread_time() - mine < 0.05:  # this thread works
            sum(range(1000))
        assert activity.cpu() - before < 0.025
    finally:
        done.set()
        thread.join()


def test_a_task_that_raises_still_ends_the_resume_pool_s_work():
    activity = worker.ResumeActivity(clock=Clock())
    with pytest.raises(RuntimeError), activity.task():
        raise RuntimeError("the task failed")
    assert activity.running is False
    assert activity.ended_at == 100.0


@pytest.mark.django_db(transaction=True)
def test_the_resume_pool_tells_its_activity_of_each_task_it_runs(monkeypatch):
    queue.resume_run_task.enqueue(1)
    pool = _resume_pool(max_tasks=1)
    seen = []

    def run_task(self, task_result):
        seen.append(pool.activity.active())
        self._run_tasks += 1

    monkeypatch.setattr(worker.db_worker.Worker, "run_task", run_task)

    pool.run()

    assert seen == [True]
    assert pool.activity.running is False
    assert pool.activity.ended_at is not None


def _paced_pool(activity, share=0.25) -> worker.NotificationsPool:
    return worker.NotificationsPool(
        worker_id="w/notifications-1",
        interval=0.25,
        stop=threading.Event(),
        listen=False,
        resumes=activity,
        share=share,
    )


@pytest.mark.parametrize(
    ("resuming", "share", "cpu", "rest"),
    [
        (True, 0.25, 0.2, 0.6),  # a quarter: three times the CPU it took
        (True, 0.5, 0.2, 0.2),
        (True, 0.25, 10.0, worker.MAX_REST_SECONDS),
        (True, 0.25, 0.0, 0.0),  # a delivery that only waited on its receiver
        (True, 1.0, 0.2, 0.0),  # no limit
        (False, 0.25, 0.2, 0.0),  # no resumes: catch up at full speed
    ],
)
def test_a_busy_pass_rests_in_proportion_to_its_cpu_only_while_resumes_go_on(
    resuming, share, cpu, rest
):
    clock = Clock()
    activity = worker.ResumeActivity(clock=clock)
    if resuming:
        activity.running = True

    assert _paced_pool(activity, share).rest_after(cpu) == pytest.approx(rest)


@pytest.mark.parametrize(
    ("resume_cpu", "rest"),
    [
        (0.001, 0.0),  # the resumes wait (on a model): the pass takes the idle interpreter
        (0.019, 0.0),
        (0.021, 0.6),  # over a tenth of the pass's CPU: they want the interpreter
        (0.2, 0.6),
        (None, 0.6),  # not known on this platform: the task alone says
    ],
)
def test_a_busy_pass_rests_only_when_the_resumes_wanted_the_interpreter(resume_cpu, rest):
    activity = worker.ResumeActivity(clock=Clock())
    activity.running = True

    assert _paced_pool(activity).rest_after(0.2, resume_cpu) == pytest.approx(rest)


def test_the_pool_s_share_is_divided_among_its_threads():
    assert worker.thread_share(0.25, 1) == 0.25
    assert worker.thread_share(0.25, 2) == 0.125
    assert worker.thread_share(0.25, 0) == 0.25
    assert worker.thread_share(1.0, 4) == 1.0


def test_a_pool_without_a_resume_pool_never_rests():
    assert _paced_pool(None).rest_after(1.0) == 0.0


@pytest.mark.parametrize("share", [0, -0.5, 1.5])
def test_a_share_out_of_range_is_refused(share):
    with pytest.raises(ValueError, match="more than 0 and at most 1"):
        _paced_pool(None, share)


def test_the_pool_rests_after_each_busy_pass_while_resumes_go_on(monkeypatch):
    activity = worker.ResumeActivity(clock=Clock())
    activity.running = True
    pool = _paced_pool(activity)
    # The thread's CPU clock, read before each pass and after each busy one.
    cpu = iter([0.0, 0.1, 0.1, 0.1, 0.3, 0.3])
    pool.cpu_clock = lambda: next(cpu)

    rests, waits = _run_passes(monkeypatch, pool, [True, False, True])

    # The two busy passes took 0.1 and 0.2 s of CPU: rests of 0.3 and 0.6 s; the idle pass and
    # the last one wait as idle passes do.
    assert (rests, waits) == ([0.3, 0.6], 2)


def test_the_pool_goes_on_when_the_resume_pool_attaches_its_clock_during_a_pass(monkeypatch):
    activity = worker.ResumeActivity(clock=Clock())
    activity.running = True
    pool = _paced_pool(activity)
    cpu = iter([0.0, 0.1, 0.1])
    pool.cpu_clock = lambda: next(cpu)

    def resume_pool_starts():
        activity.thread_cpu = lambda: 3.0
        return True

    rests, _ = _run_passes(monkeypatch, pool, [resume_pool_starts])

    # Its CPU over the pass is not known: the task alone says, as where it cannot be read.
    assert rests == [0.3]


def test_the_pool_does_not_rest_beside_resumes_that_only_wait(monkeypatch):
    activity = worker.ResumeActivity(clock=Clock())
    activity.running = True
    activity.thread_cpu = lambda: 7.0  # the resume thread takes no CPU at all
    pool = _paced_pool(activity)
    cpu = iter([0.0, 0.1, 0.1, 0.3, 0.3])
    pool.cpu_clock = lambda: next(cpu)

    rests, _ = _run_passes(monkeypatch, pool, [True, True])

    assert rests == []


@pytest.mark.django_db
def test_the_command_refuses_a_share_out_of_range():
    with pytest.raises(CommandError, match="--notifications-share: a share must be more than 0"):
        call_command("worker", "--notifications-share", "0")
