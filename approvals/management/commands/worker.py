"""The console's worker: two pools in one process, plus the reaper.

The resume pool (ResumePool) is django-tasks-db's Worker on the default queue (resume and start
tasks), in the main thread, with a loop of its own that claims a task in one statement
(approvals.execution.workers.claim_next); on PostgreSQL it LISTENs for the NOTIFY that each
enqueue sends on commit, so an approved run starts at once instead of at the next poll
(polling stays as the fallback).

The notifications pool (--notification-threads threads, 1 by default) serves the notifications
queue (queue.SIDE_QUEUE: webhook and email deliveries), so a receiver or an SMTP server that
hangs holds up only that pool, never a resume. Before each claim it sends signals.audit_tail:
notifications fans out the audit events committed since its last look, here rather than in
the request or the resume that committed them. It polls every --notifications-interval
seconds (woken early on PostgreSQL by a NOTIFY on its own channel) and at once while it has
work. Resumes come first: while the resume pool has work that wants the interpreter, the
notifications pool's busy passes keep to a share of the process's CPU (--notifications-share;
ResumeActivity), so a fan-out backlog (a worker that was down, a burst of events) is caught up
beside the resumes without taking their interpreter from them; beside resumes that only wait
(on a model's answer) it goes at full speed.

django-tasks-db has no lease: a worker killed mid-task leaves its task RUNNING forever. So every
worker process also runs the reaper (they are safe together): each pass records this
process's heartbeat, settles the RUNNING task rows of workers not seen for a few lease lengths
(approvals.execution.workers), reaps runs, and sends signals.worker_housekeeping, so the apps
that listen to approvals (notifications: lost deliveries) do their own housekeeping without
approvals knowing them.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, close_old_connections, connection
from django.utils.crypto import get_random_string
from django_tasks_db.compat import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME
from django_tasks_db.management.commands import db_worker
from django_tasks_db.models import DBTaskResult

from approvals import signals
from approvals.execution import queue, workers
from approvals.runs import reaper

logger = logging.getLogger("approvals.worker")


def _reaper_loop(interval: float, stop: threading.Event, worker_ids: list[str]) -> None:
    while not stop.wait(interval):
        try:
            workers.beat(worker_ids)
            settled = workers.settle_abandoned_tasks()
            if settled:
                logger.warning(
                    "reaper: settled %s task rows left running by stopped workers: %s",
                    len(settled),
                    ", ".join(settled),
                )
            report = reaper.reap()
            if any(vars(report).values()):
                logger.info(
                    "reaper: requeued %s, re-enqueued %s, expired %s, rejected %s, "
                    "escalated %s, queued %s, waiting for their callers %s",
                    report.requeued,
                    report.reenqueued,
                    report.expired_runs,
                    report.rejected,
                    report.escalated,
                    report.queued,
                    report.awaiting_caller,
                )
            for receiver, said in signals.worker_housekeeping.send_robust(sender=None):
                if isinstance(said, Exception):
                    logger.error("housekeeping by %r failed", receiver, exc_info=said)
                elif said:
                    logger.info("housekeeping: %s", said)
        except Exception:
            logger.exception("reaper pass failed; trying again next time")
        finally:
            connection.close()


class Listener:
    """Waits for a NOTIFY on its wake channel, or the poll interval, whichever comes first."""

    def __init__(self, channel: str = queue.WAKE_CHANNEL) -> None:
        self.channel = channel
        self.conn = None

    def _connect(self):
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"LISTEN {self.channel}")
        return conn

    def wait(self, seconds: float) -> None:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = self._connect()
            for _ in self.conn.notifies(timeout=seconds, stop_after=1):
                break
        except Exception:
            # A broken listen connection only costs the poll interval; try again next time.
            logger.warning("worker: LISTEN failed, polling instead", exc_info=True)
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            time.sleep(seconds)


class ResumeActivity:
    """What the resume pool is doing, as the notifications pool sees it: whether it has work (a
    task running now, or one ended a moment ago: the pool claims the next at once while there
    are more), and its thread's CPU clock, which says whether that work wants the interpreter
    (a resume waiting on a model's answer holds none of it). Written by the resume pool's
    thread, read by the notifications pool's."""

    # A task ended this recently still counts: the next claim follows within a statement.
    RECENT_SECONDS = 0.5

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.running = False
        self.ended_at: float | None = None
        self.thread_cpu: Callable[[], float] | None = None

    def attach(self) -> None:
        """Called on the resume pool's thread: its CPU clock, read from other threads where the
        platform has one per thread (Linux); elsewhere thread_cpu stays None."""
        try:
            clock_id = time.pthread_getcpuclockid(threading.get_ident())
            time.clock_gettime(clock_id)
        except (AttributeError, OSError):
            return
        self.thread_cpu = functools.partial(time.clock_gettime, clock_id)

    def cpu(self) -> float | None:
        """The resume pool's thread's CPU seconds so far, or None where it cannot be read."""
        return self.thread_cpu() if self.thread_cpu is not None else None

    @contextmanager
    def task(self) -> Iterator[None]:
        self.running = True
        try:
            yield
        finally:
            # The end first: a reader between the two lines sees a task that just ended.
            self.ended_at = self.clock()
            self.running = False

    def active(self) -> bool:
        if self.running:
            return True
        return self.ended_at is not None and self.clock() - self.ended_at < self.RECENT_SECONDS


class ResumePool(db_worker.Worker):
    """The resume pool: django-tasks-db's Worker (running a task, its result and signals, the
    graceful stop on SIGTERM) with a loop of its own, which claims each task in one statement
    (workers.claim_next) and, between polls, waits on its Listener (a NOTIFY ends the wait).
    Each task it runs is told to `activity`, which the notifications pool reads."""

    def __init__(
        self, *, listener: Listener | None, activity: ResumeActivity | None = None, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.listener = listener
        self.activity = activity or ResumeActivity()

    def run_task(self, task_result: DBTaskResult) -> None:
        with self.activity.task(), workers.hinted(getattr(task_result, "run_hint", None)):
            super().run_task(task_result)

    def run(self) -> None:
        logger.info("Starting worker worker_id=%s queues=%s", self.worker_id, self.queue_names)
        self.activity.attach()
        close_old_connections()
        while self.running:
            # A SIGTERM during the claim waits for it, as for a task: a claim cut short could
            # leave a task RUNNING that nobody runs (until the reaper settles it).
            self.running_task = True
            try:
                task_result = self.claim()
            finally:
                self.running_task = False
            if task_result is not None:
                self.run_task(task_result)
                # The next claim follows at once: its connection is this one, unless the task
                # broke it, rather than one borrowed from the pool and checked again.
                workers.keep_if_usable(connection)
            if self.max_tasks is not None and self._run_tasks >= self.max_tasks:
                logger.info("Ran %d tasks on worker %s; exiting", self._run_tasks, self.worker_id)
                close_old_connections()
                return
            # A SIGTERM during the task cleared running: stop now, without waiting.
            if self.running and task_result is None:
                # Handed back while idle; dropped or expired connections are seen to on
                # waking (the pool checks the next one it lends), as db_worker does.
                close_old_connections()
                self.wait()
        close_old_connections()

    def claim(self) -> DBTaskResult | None:
        """workers.claim_next() for this pool. A connection kept from the last task that fails
        the claim (closed by the server since) is dropped, and the claim sent once more on a
        connection the pool has checked."""
        kept = connection.connection is not None
        try:
            return self._claim_next()
        except DatabaseError:
            if not kept or connection.is_usable():
                raise
            logger.warning("worker: the kept connection failed; claiming again on a fresh one")
            connection.close()
            return self._claim_next()

    def _claim_next(self) -> DBTaskResult | None:
        return workers.claim_next(
            backend_name=self.backend_name, queue_names=self.queue_names, worker_id=self.worker_id
        )

    def wait(self) -> None:
        if self.listener is not None:
            self.listener.wait(self.interval)
        else:
            time.sleep(self.interval)


# Events fanned out in one pass from which the notifications pool goes on to the next pass at
# once (the fan-out takes at most 100 of each tenant's events a pass).
FAN_OUT_BACKLOG = 100

# The notifications pool's share of the process's CPU while the resume pool's work wants it:
# after a busy pass that took c seconds of its thread's CPU, a thread of the pool rests
# c * (1 - share) / share seconds (3 c at a quarter), at most MAX_REST_SECONDS. CPU, not wall
# time: a delivery waiting on a receiver that never answers holds no CPU and earns no rest. The
# pool's share is divided among its threads.
NOTIFICATIONS_SHARE = 0.25
MAX_REST_SECONDS = 5.0
# The resume pool's work wants the interpreter when its thread took at least this part of the
# CPU the pass took, over the same pass: a resume waiting on a model, a tool or the database
# takes next to none, and then the pass rests not at all.
CONTENDED = 0.1


def check_share(share: float) -> None:
    """Raises ValueError unless share is a share the notifications pool can keep to."""
    if not 0 < share <= 1:
        raise ValueError(f"a share must be more than 0 and at most 1, not {share:g}")


def thread_share(share: float, threads: int) -> float:
    """Each thread's part of the notifications pool's share: the pool's, divided among its
    threads; 1 (no limit) stays 1."""
    return 1.0 if share >= 1 else share / max(threads, 1)


class NotificationsPool:
    """One thread of the notifications pool: the fan-out's catch-up, then one task of its queue.

    It drives django-tasks-db's Worker for running a task (its result, its signals) but loops
    itself, so that the fan-out runs before every claim and its sleep is its own, not the
    resume pool's. While `resumes` (the process's resume pool) has work that wants the
    interpreter, each busy pass is followed by a rest in proportion to the CPU it took
    (rest_after), so the thread keeps to `share` of the interpreter the resumes run in; with no
    resumes going on, or resumes that only wait, it catches up at full speed. A share of 1
    never rests.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        interval: float,
        stop: threading.Event,
        listen: bool,
        resumes: ResumeActivity | None = None,
        share: float = NOTIFICATIONS_SHARE,
        cpu_clock: Callable[[], float] = time.thread_time,
    ):
        check_share(share)
        self.worker = db_worker.Worker(
            queue_names=[queue.SIDE_QUEUE],
            interval=interval,
            batch=False,
            backend_name=DEFAULT_TASK_BACKEND_ALIAS,
            startup_delay=False,
            max_tasks=None,
            worker_id=worker_id,
            excluded_queue_names=[],
        )
        self.interval = interval
        self.stop = stop
        self.listener = Listener(queue.SIDE_WAKE_CHANNEL) if listen else None
        self.resumes = resumes
        self.share = share
        self.cpu_clock = cpu_clock

    def run(self) -> None:
        while not self.stop.is_set():
            cpu_before = self.cpu_clock()
            resume_cpu_before = self.resumes.cpu() if self.resumes is not None else None
            try:
                busy = self.step()
            except Exception:
                logger.exception("notifications pool: pass failed; trying again next time")
                busy = False
            finally:
                close_old_connections()
            if not busy:
                self.wait()
            else:
                resume_cpu = self.resumes.cpu() if self.resumes is not None else None
                rest = self.rest_after(
                    self.cpu_clock() - cpu_before,
                    # Not known across the resume pool's start, which attaches its clock.
                    None
                    if resume_cpu is None or resume_cpu_before is None
                    else resume_cpu - resume_cpu_before,
                )
                if rest:
                    self.stop.wait(rest)
        connection.close()

    def rest_after(self, cpu_seconds: float, resume_cpu_seconds: float | None = None) -> float:
        """Seconds to rest after a busy pass that took cpu_seconds of this thread's CPU, while
        the resume pool's thread took resume_cpu_seconds (None: not known on this platform).

        No rest while the resume pool has no work, or its work took less than CONTENDED of the
        pass's CPU (it waits, on a model, a tool or the database, and wants no interpreter),
        or with a share of 1; else enough that this thread keeps to its share, at most
        MAX_REST_SECONDS (a pass of more CPU than that allows, when many tenants are behind at
        once, takes more than its share).
        """
        if self.share >= 1 or self.resumes is None or not self.resumes.active():
            return 0.0
        cpu_seconds = max(cpu_seconds, 0.0)
        if resume_cpu_seconds is not None and resume_cpu_seconds < CONTENDED * cpu_seconds:
            return 0.0
        return min(cpu_seconds * (1 - self.share) / self.share, MAX_REST_SECONDS)

    def step(self) -> bool:
        """One pass: the fan-out catches up, then one task runs. Whether the next pass should
        follow at once: a task ran (more may be waiting), or the fan-out found a backlog.

        A pass that fanned out only a few events is not busy: the next one waits as an idle
        pass does (a delivery task's NOTIFY still wakes it at once). While runs go on, events
        come all the time, and a pass for each one or two of them would cost the worker its
        statements (the tenants behind, the fan-out lock, the cursor, the task claim) every
        time, on the resumes' cores.
        """
        fanned = 0
        for receiver, said in signals.audit_tail.send_robust(sender=None):
            if isinstance(said, Exception):
                logger.error("audit tail by %r failed", receiver, exc_info=said)
            elif said:
                fanned += int(said)
        task_result = self._claim()
        if task_result is not None:
            self.worker.run_task(task_result)
            return True
        return fanned >= FAN_OUT_BACKLOG

    def _claim(self) -> DBTaskResult | None:
        return workers.claim_next(
            backend_name=self.worker.backend_name,
            queue_names=self.worker.queue_names,
            worker_id=self.worker.worker_id,
        )

    def wait(self) -> None:
        if self.listener is not None:
            self.listener.wait(self.interval)
        else:
            self.stop.wait(self.interval)


class Command(BaseCommand):
    help = (
        "Run resume tasks (db_worker, woken by NOTIFY on PostgreSQL), the notifications pool "
        "(fan-out and deliveries, in their own threads) and the reaper."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
        parser.add_argument("--worker-id", default=None)
        parser.add_argument(
            "--max-tasks", type=int, default=None, help="exit after this many resume tasks"
        )
        parser.add_argument(
            "--no-listen", action="store_true", help="poll only, even on PostgreSQL"
        )
        parser.add_argument(
            "--notification-threads",
            type=int,
            default=1,
            help="threads of the notifications pool (fan-out, webhooks, emails); 0 for none",
        )
        parser.add_argument(
            "--notifications-interval",
            type=float,
            default=0.25,
            help="seconds between the notifications pool's polls when it is idle",
        )
        parser.add_argument(
            "--notifications-share",
            type=float,
            default=NOTIFICATIONS_SHARE,
            help=(
                "share of the worker's CPU the notifications pool (all its threads) may take "
                "while resumes are running and want it, in (0, 1] "
                f"(default {NOTIFICATIONS_SHARE}; 1: no limit)"
            ),
        )

    def handle(
        self,
        *args,
        interval: float,
        worker_id: str | None,
        max_tasks: int | None,
        no_listen: bool,
        notification_threads: int,
        notifications_interval: float,
        notifications_share: float,
        **options,
    ) -> None:
        try:
            check_share(notifications_share)
        except ValueError as error:
            raise CommandError(f"--notifications-share: {error}") from None
        worker_id = worker_id or get_random_string(32)
        listen = connection.vendor == "postgresql" and not no_listen
        stop = threading.Event()
        activity = ResumeActivity()
        pools = [
            NotificationsPool(
                worker_id=f"{worker_id}/notifications-{n}",
                interval=notifications_interval,
                stop=stop,
                listen=listen,
                resumes=activity,
                share=thread_share(notifications_share, notification_threads),
            )
            for n in range(1, notification_threads + 1)
        ]
        # Seen before the first task is claimed, so no other reaper takes this one for dead.
        worker_ids = [worker_id, *(pool.worker.worker_id for pool in pools)]
        workers.beat(worker_ids)
        connection.close()
        threads = [
            threading.Thread(
                target=_reaper_loop,
                args=(settings.APPROVALS_REAPER_INTERVAL_SECONDS, stop, worker_ids),
                name="reaper",
                daemon=True,
            ),
            *(
                threading.Thread(target=pool.run, name=f"notifications-{n}", daemon=True)
                for n, pool in enumerate(pools, start=1)
            ),
        ]
        for thread in threads:
            thread.start()
        # db_worker's own logging: a line per task, to this command's output.
        db_worker.Command().configure_logging(options["verbosity"])
        # No autoreload: a reloaded worker would leave its task RUNNING mid-resume.
        pool = ResumePool(
            listener=Listener() if listen else None,
            activity=activity,
            queue_names=[DEFAULT_TASK_QUEUE_NAME],
            interval=interval,
            batch=False,
            backend_name=DEFAULT_TASK_BACKEND_ALIAS,
            startup_delay=False,
            # 0, like no --max-tasks, is no limit.
            max_tasks=max_tasks or None,
            worker_id=worker_id,
            excluded_queue_names=[],
        )
        try:
            pool.configure_signals()
            pool.run()
        finally:
            stop.set()
            # A delivery still waiting on its receiver is not waited for: its row is settled by
            # a reaper, and the delivery's own housekeeping sends it again.
            for thread in threads[1:]:
                thread.join(timeout=2)
