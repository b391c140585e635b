"""The models and the migrations agree: nothing is waiting to be generated."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from approvals.audit import guard

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db
def test_makemigrations_check_finds_no_changes():
    out = StringIO()

    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=StringIO())

    assert out.getvalue() == "No changes detected\n"


def test_migrating_a_new_sqlite_database_leaves_the_audit_table_append_only(tmp_path):
    """SQLite changes a table by copying it into a new one, which drops its triggers: every
    migration that changes the audit table must leave the append-only guard in place."""
    database = tmp_path / "migrated.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}"}

    result = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert result.returncode == 0, result.stderr
    with closing(sqlite3.connect(database)) as db:
        triggers = db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?",
            [guard.TABLE],
        ).fetchall()
    assert sorted(name for (name,) in triggers) == [
        "approvals_audit_no_delete",
        "approvals_audit_no_update",
    ]
