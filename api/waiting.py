"""Long polls: hold an answer until a run leaves the states in which it is still moving.

The wait holds neither a transaction nor (outside a test's transaction) a database connection:
it re-reads the run's status row at APPROVALS_API_WAIT_POLL_SECONDS and hands its connection
back (to the pool, when pooling is on) between reads.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connection

from approvals.models import Run, RunStatus

# A run in one of these is still moving towards an answer the caller waits for.
MOVING = frozenset({RunStatus.STARTING, RunStatus.PAUSED, RunStatus.QUEUED, RunStatus.RESUMING})
MAX_WAIT_SECONDS = 30
# The wait's clock and pause (tests replace them to move time on by themselves).
clock = time.monotonic
sleep = time.sleep


def status_of(run_id: int) -> str | None:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first()


def _release_connection() -> None:
    # Inside a transaction (a test's) the connection is the transaction's and stays.
    if not connection.in_atomic_block:
        connection.close()


def wait_for_run(run_id: int, *, seconds: float) -> str | None:
    """Re-read the run's status until it is not MOVING or `seconds` have passed; its status."""
    deadline = clock() + min(seconds, MAX_WAIT_SECONDS)
    while True:
        status = status_of(run_id)
        left = deadline - clock()
        if status not in MOVING or left <= 0:
            return status
        _release_connection()
        sleep(min(settings.APPROVALS_API_WAIT_POLL_SECONDS, left))
