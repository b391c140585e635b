"""The console's worker: django-tasks-db's db_worker plus the reaper on a timer.

db_worker has no lease: a worker killed mid-task leaves its task RUNNING forever. The reaper
thread is what brings such runs back, so every worker process runs one (they are safe together).
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connection

from approvals import services

logger = logging.getLogger("approvals.worker")


def _reaper_loop(interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        try:
            report = services.reap()
            if report.requeued or report.reenqueued or report.expired_runs:
                logger.info(
                    "reaper: requeued %s, re-enqueued %s, expired %s",
                    report.requeued,
                    report.reenqueued,
                    report.expired_runs,
                )
        except Exception:
            logger.exception("reaper pass failed; trying again next time")
        finally:
            connection.close()


class Command(BaseCommand):
    help = "Run resume tasks (db_worker) with the reaper in the same process."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
        parser.add_argument("--worker-id", default=None)

    def handle(self, *args, interval: float, worker_id: str | None, **options) -> None:
        stop = threading.Event()
        reaper = threading.Thread(
            target=_reaper_loop,
            args=(settings.APPROVALS_REAPER_INTERVAL_SECONDS, stop),
            name="reaper",
            daemon=True,
        )
        reaper.start()
        extra = {"worker_id": worker_id} if worker_id else {}
        try:
            # No autoreload: a reloaded worker would leave its task RUNNING mid-resume.
            call_command("db_worker", interval=interval, reload=False, **extra)
        finally:
            stop.set()
