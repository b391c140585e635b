"""Database triggers that make the audit table append-only, on PostgreSQL and SQLite."""

from __future__ import annotations

TABLE = "approvals_auditevent"

_POSTGRES_INSTALL = [
    f"""
    CREATE OR REPLACE FUNCTION approvals_audit_append_only() RETURNS trigger AS $$
    BEGIN
        RAISE EXCEPTION '{TABLE} is append-only: % refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END;
    $$ LANGUAGE plpgsql
    """,
    f"DROP TRIGGER IF EXISTS approvals_audit_append_only ON {TABLE}",
    f"""
    CREATE TRIGGER approvals_audit_append_only BEFORE UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION approvals_audit_append_only()
    """,
]
_POSTGRES_REMOVE = [
    f"DROP TRIGGER IF EXISTS approvals_audit_append_only ON {TABLE}",
    "DROP FUNCTION IF EXISTS approvals_audit_append_only()",
]
_SQLITE_INSTALL = [
    f"""
    CREATE TRIGGER IF NOT EXISTS approvals_audit_no_update BEFORE UPDATE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{TABLE} is append-only: UPDATE refused'); END
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS approvals_audit_no_delete BEFORE DELETE ON {TABLE}
    BEGIN SELECT RAISE(ABORT, '{TABLE} is append-only: DELETE refused'); END
    """,
]
_SQLITE_REMOVE = [
    "DROP TRIGGER IF EXISTS approvals_audit_no_update",
    "DROP TRIGGER IF EXISTS approvals_audit_no_delete",
]


def _statements(vendor: str, *, install: bool) -> list[str]:
    if vendor == "postgresql":
        return _POSTGRES_INSTALL if install else _POSTGRES_REMOVE
    if vendor == "sqlite":
        return _SQLITE_INSTALL if install else _SQLITE_REMOVE
    raise NotImplementedError(f"no append-only guard for {vendor}")


def install(connection) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=True):
            cursor.execute(sql)


def remove(connection) -> None:
    with connection.cursor() as cursor:
        for sql in _statements(connection.vendor, install=False):
            cursor.execute(sql)
