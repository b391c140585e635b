from __future__ import annotations

from django.db import migrations, models


def install_guard(apps, schema_editor):
    from approvals.audit import guard

    guard.install(schema_editor.connection)


class Migration(migrations.Migration):
    """The id of the key that linked each audit event.

    SQLite adds a column with a default by copying the table into a new one, which leaves the
    append-only triggers behind: they are installed again after the change, either way.
    Events already there get no key id (legacy, plain SHA-256) and verify as before. Migrating
    back past it drops the key ids: the events linked with a key since then no longer verify.
    """

    dependencies = [("approvals", "0007_policy_retired")]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, install_guard),
        migrations.AddField(
            model_name="auditevent",
            name="hash_key_id",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.RunPython(install_guard, migrations.RunPython.noop),
    ]
