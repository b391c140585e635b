"""On PostgreSQL a task row's insert wakes the workers that serve its queue: a trigger sends the
NOTIFY (delivered at commit, like the statement it replaces), so an enqueue costs no statement
of its own. approvals.execution.queue names the channels."""

from django.db import migrations

# The channels are approvals.execution.queue's WAKE_CHANNEL and SIDE_WAKE_CHANNEL (for the
# SIDE_QUEUE); written out here, as a migration must not change when the code does.
CREATE = """
CREATE OR REPLACE FUNCTION approvals_wake_workers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        CASE WHEN NEW.queue_name = 'notifications'
             THEN 'approvals_notifications' ELSE 'approvals_resume' END,
        ''
    );
    RETURN NULL;
END
$$;
CREATE TRIGGER approvals_wake_workers AFTER INSERT ON django_tasks_database_dbtaskresult
    FOR EACH ROW EXECUTE FUNCTION approvals_wake_workers();
"""
DROP = """
DROP TRIGGER IF EXISTS approvals_wake_workers ON django_tasks_database_dbtaskresult;
DROP FUNCTION IF EXISTS approvals_wake_workers();
"""


def _on_postgresql(sql: str):
    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0012_worker_heartbeat"),
        ("django_tasks_database", "0021_conditional_partial_index_ordering"),
    ]

    operations = [migrations.RunPython(_on_postgresql(CREATE), _on_postgresql(DROP))]
