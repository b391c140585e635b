"""The console's worker: django-tasks-db's db_worker, woken by NOTIFY, plus the reaper.

It serves the default queue: resume tasks and the notifications' webhook and email tasks. Each
reaper pass also sends signals.worker_housekeeping, so the apps that listen to approvals
(notifications: lost deliveries) do their own housekeeping without approvals knowing them.

db_worker polls on a timer and has no lease: a worker killed mid-task leaves its task RUNNING
forever. So every worker process also runs the reaper (they are safe together), and on
PostgreSQL it LISTENs for the NOTIFY that each enqueue sends on commit, so an approved run
starts at once instead of at the next poll. Polling stays as the fallback.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection
from django_tasks_db.management.commands import db_worker

from approvals import signals
from approvals.execution import queue
from approvals.runs import reaper

logger = logging.getLogger("approvals.worker")


def _reaper_loop(interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        try:
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
    """Waits for a NOTIFY on the wake channel, or the poll interval, whichever comes first."""

    def __init__(self) -> None:
        self.conn = None

    def _connect(self):
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"LISTEN {queue.WAKE_CHANNEL}")
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


class _WakingClock:
    """Stands in for the time module inside db_worker: its sleep() returns early on NOTIFY."""

    def __init__(self, listener: Listener) -> None:
        self.sleep = listener.wait

    def __getattr__(self, name: str):
        return getattr(time, name)


class Command(BaseCommand):
    help = "Run resume tasks (db_worker, woken by NOTIFY on PostgreSQL) with the reaper."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
        parser.add_argument("--worker-id", default=None)
        parser.add_argument("--max-tasks", type=int, default=None)
        parser.add_argument(
            "--no-listen", action="store_true", help="poll only, even on PostgreSQL"
        )

    def handle(
        self,
        *args,
        interval: float,
        worker_id: str | None,
        max_tasks: int | None,
        no_listen: bool,
        **options,
    ) -> None:
        stop = threading.Event()
        reaper = threading.Thread(
            target=_reaper_loop,
            args=(settings.APPROVALS_REAPER_INTERVAL_SECONDS, stop),
            name="reaper",
            daemon=True,
        )
        reaper.start()
        if connection.vendor == "postgresql" and not no_listen:
            db_worker.time = _WakingClock(Listener())
        extra = {"worker_id": worker_id} if worker_id else {}
        if max_tasks:
            extra["max_tasks"] = max_tasks
        try:
            # No autoreload: a reloaded worker would leave its task RUNNING mid-resume.
            call_command("db_worker", interval=interval, reload=False, startup_delay=False, **extra)
        finally:
            stop.set()
