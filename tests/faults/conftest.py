"""The long fault-injection suite (`make faults`): real processes, real crashes, real load.

Skipped unless APPROVALS_FAULTS=1, never silently: each test shows the reason. Shared here:
polling waits, a console server process (daphne's ASGI runserver) against the test database,
a stdlib HTTP client that signs in like a browser, and PostgreSQL helpers that kill backends.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.db import connection

from devtools.processes import Proc, Processes, Response, free_port, wait_for_http
from tests.conftest import subprocess_env

FAULTS_DIR = Path(__file__).resolve().parent
SKIP_REASON = "long fault tests: run make faults (APPROVALS_FAULTS=1)"
POSTGRES_ONLY = "needs PostgreSQL ({why}); this run uses SQLite"
STARTUP_SECONDS = 40


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "faults: long fault-injection test; runs only with APPROVALS_FAULTS=1"
    )


def pytest_collection_modifyitems(config, items) -> None:
    if os.environ.get("APPROVALS_FAULTS") == "1":
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if FAULTS_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


def require_postgres(why: str) -> None:
    if connection.vendor != "postgresql":
        pytest.skip(POSTGRES_ONLY.format(why=why))


# --- waiting ----------------------------------------------------------------------------------


@pytest.fixture
def processes(tmp_path) -> Iterator[Callable[..., Proc]]:
    """start(name, *argv, env=...) runs argv (manage.py args, or an absolute program) with its
    output in a file; every process is killed and reaped when the test ends."""
    procs = Processes(tmp_path)
    yield procs.start
    procs.stop_all(kill=True)


def start_console(processes, *, env: dict[str, str] | None = None) -> tuple[str, Proc]:
    """`manage.py runserver --noreload` (daphne, ASGI) on a free port, answering /login/."""
    port = free_port()
    server = processes(
        "server",
        "runserver",
        "--noreload",
        f"127.0.0.1:{port}",
        env=env or subprocess_env(LOG_LEVEL="INFO"),
    )
    url = f"http://127.0.0.1:{port}"
    wait_for_http(url, server, timeout=STARTUP_SECONDS)
    return url, server


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """PBKDF2 with few iterations: the hash names pbkdf2_sha256, which the server accepts (it
    re-hashes at the first sign-in). The suite's MD5 test hasher is not in the server's list."""

    iterations = 1000


@pytest.fixture
def server_passwords(settings):
    """Users made by this test can sign in through a server process."""
    settings.PASSWORD_HASHERS = ["tests.faults.conftest.FastPBKDF2PasswordHasher"]


def no_traceback(response: Response) -> bool:
    return not re.search(r"Traceback|Exception Value|Request Method:", response.body)


# --- PostgreSQL: who is connected, and cutting them off ----------------------------------------


def with_application_name(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


def backends(application_name: str) -> list[tuple[int, str, str, str]]:
    """(pid, state, wait_event_type, query) of this database's backends with that name."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, state, coalesce(wait_event_type, ''), query FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = %s",
            [application_name],
        )
        return list(cursor.fetchall())


@contextlib.contextmanager
def row_locked(table: str, pk: int) -> Iterator[int]:
    """Hold SELECT ... FOR UPDATE on one row from a connection of its own (the test's connection
    stays in autocommit: pg_stat_activity is a snapshot for the length of a transaction); gives
    that connection's backend pid."""
    import psycopg

    from tests.conftest import database_url

    with psycopg.connect(database_url()) as holder:
        holder.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [pk])
        try:
            yield holder.info.backend_pid
        finally:
            holder.rollback()


def blocked_by(pid: int) -> list[int]:
    """The backends whose locks the backend pid waits for."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_blocking_pids(%s)", [pid])
        return list(cursor.fetchone()[0])


def terminate_backends(application_name: str) -> int:
    """pg_terminate_backend every connection of this database with that application_name."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = %s",
            [application_name],
        )
        return cursor.fetchone()[0]
