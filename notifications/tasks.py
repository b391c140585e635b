"""The queue's old addresses of the notifications' tasks: nothing in the code imports this.

A queued task is stored with its dotted path and found again by it when a worker runs it. The
tasks now live beside the function each one calls (deliveries, emails), so the tasks already
queued under notifications.tasks.* before that move still need these names: the three below
are the same tasks under their old paths, and send_email_task, which only ever runs tasks
queued by an older version, stays defined here.
"""

from __future__ import annotations

from django_tasks import task

from notifications.attempts import QUEUE
from notifications.deliveries import deliver_webhook_task
from notifications.emails import deliver_email_task, deliver_emails_task, send_email

__all__ = ["deliver_email_task", "deliver_emails_task", "deliver_webhook_task", "send_email_task"]


@task(queue_name=QUEUE)
def send_email_task(audit_event_id: int, recipients: list[str]) -> int:
    """Kept for tasks queued before each email had a row: it only writes those rows."""
    return send_email(audit_event_id=audit_event_id, recipients=recipients)
