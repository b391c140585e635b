"""The workers that are alive: each `manage.py worker` says so on every reaper pass."""

from __future__ import annotations

from django.db import models


class WorkerHeartbeat(models.Model):
    """When a worker (one id per pool of a process, as its task rows name it) was last seen.

    A task row left RUNNING by a worker not seen for a while is settled by the reaper
    (approvals.execution.workers): the queue itself has no lease."""

    worker_id = models.CharField(max_length=128, primary_key=True)
    last_seen = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.worker_id} seen {self.last_seen:%Y-%m-%d %H:%M:%S}"
