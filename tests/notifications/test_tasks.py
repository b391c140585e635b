"""Tasks queued before the tasks moved beside their functions still run: the queue finds a task
by the dotted path stored with it, and notifications.tasks keeps the old paths."""

from __future__ import annotations

import pytest
from django_tasks_db.models import DBTaskResult

from notifications.deliveries import deliver_webhook_task
from notifications.emails import deliver_email_task, deliver_emails_task
from notifications.tasks import send_email_task

pytestmark = pytest.mark.django_db

# Nothing to send: the row does not exist.
SKIPPED = {"delivered": 0, "failed": 0, "skipped": 1}


@pytest.mark.parametrize(
    ("old_path", "task", "args", "result"),
    [
        ("notifications.tasks.deliver_webhook_task", deliver_webhook_task, [404], SKIPPED),
        ("notifications.tasks.deliver_email_task", deliver_email_task, [404], SKIPPED),
        ("notifications.tasks.deliver_emails_task", deliver_emails_task, [[404]], SKIPPED),
    ],
)
def test_a_task_queued_under_its_old_path_runs_the_task_that_moved(old_path, task, args, result):
    task.enqueue(*args)
    DBTaskResult.objects.update(task_path=old_path)  # as an older version stored it

    row = DBTaskResult.objects.get()

    assert row.task.func is task.func
    assert row.task.call(*row.args_kwargs["args"]) == result


def test_the_task_for_rows_queued_before_emails_had_rows_keeps_its_path():
    assert send_email_task.module_path == "notifications.tasks.send_email_task"
