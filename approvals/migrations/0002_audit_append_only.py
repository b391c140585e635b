from __future__ import annotations

from django.db import migrations


def install(apps, schema_editor):
    from approvals.audit import guard

    guard.install(schema_editor.connection)


def remove(apps, schema_editor):
    from approvals.audit import guard

    guard.remove(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("approvals", "0001_initial")]

    operations = [migrations.RunPython(install, remove)]
