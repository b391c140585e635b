"""The bench database (dropped and recreated, never another one) and the bench's children."""

from __future__ import annotations

import psycopg
from django.core.management import call_command
from django.db import connection

from devtools.processes import child_env

# --- the bench database -----------------------------------------------------------------------


def bench_database_name() -> str:
    params = connection.settings_dict
    if connection.vendor != "postgresql":
        raise SystemExit(
            "bench needs PostgreSQL: DATABASE_URL=postgres://postgres@127.0.0.1:5432/approvals_bench"
        )
    name = params["NAME"]
    if "bench" not in name:
        raise SystemExit(
            f"refusing to drop database {name!r}: the bench database's name must contain 'bench'"
        )
    return name


def recreate_database() -> str:
    """DROP and CREATE the bench database (never another one), then migrate it."""

    name = bench_database_name()
    connection.close()
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params["dbname"] = "postgres"
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", interactive=False, verbosity=0)
    return name


def sessions_opened() -> int:
    """Connections ever opened to this database (pg_stat_database.sessions, PostgreSQL 14+)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


# --- processes --------------------------------------------------------------------------------


def subprocess_env(**extra: str) -> dict[str, str]:
    """A bench child: the parent's database and keys, production-like DEBUG, quiet logs."""
    return child_env(**{"DJANGO_DEBUG": "0", "LOG_LEVEL": "WARNING", **extra})
