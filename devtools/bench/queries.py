"""How many SQL statements the console's own paths send: a resume (the worker's thread and its
tools' threads together) and a pause, counted in-process on the bench database."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db.backends import utils
from django.db.backends.base.base import BaseDatabaseWrapper


@contextmanager
def counting() -> Iterator[Counter]:
    """Count every statement any thread sends, and every commit, while the block runs.

    The counter's keys: "main" (statements of the calling thread), "other" (every other thread:
    the agents' tools, the lease heartbeat), "commits". psycopg opens a transaction with BEGIN
    on the next statement and Django ends it with a commit: a transaction costs those two round
    trips more than its statements.
    """
    counts: Counter = Counter()
    # What was sent, for a reader: (thread name, the statement's first 200 characters).
    counts.log = []  # type: ignore[attr-defined]
    caller = threading.get_ident()
    lock = threading.Lock()
    execute, executemany = utils.CursorWrapper._execute, utils.CursorWrapper._executemany
    commit = BaseDatabaseWrapper._commit

    def note(key: str, sql: str = "") -> None:
        with lock:
            counts[key] += 1
            if sql:
                counts.log.append((threading.current_thread().name, str(sql)[:200]))

    def counted_execute(self, sql, *args, **kwargs):
        note("main" if threading.get_ident() == caller else "other", sql)
        return execute(self, sql, *args, **kwargs)

    def counted_executemany(self, sql, *args, **kwargs):
        note("main" if threading.get_ident() == caller else "other", sql)
        return executemany(self, sql, *args, **kwargs)

    def counted_commit(self, *args, **kwargs):
        note("commits")
        return commit(self, *args, **kwargs)

    utils.CursorWrapper._execute = counted_execute
    utils.CursorWrapper._executemany = counted_executemany
    BaseDatabaseWrapper._commit = counted_commit
    try:
        yield counts
    finally:
        utils.CursorWrapper._execute, utils.CursorWrapper._executemany = execute, executemany
        BaseDatabaseWrapper._commit = commit


def per_call(calls: list[Callable[[], Any]]) -> dict[str, float]:
    """The statements per call, averaged over the calls: in all, on the calling thread, on
    other threads, and commits."""
    with counting() as counts:
        for call in calls:
            call()
    n = len(calls)
    main, other = counts["main"] / n, counts["other"] / n
    return {
        "statements": round(main + other, 2),
        "main_thread": round(main, 2),
        "other_threads": round(other, 2),
        "commits": round(counts["commits"] / n, 2),
        "calls": n,
    }
