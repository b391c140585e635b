"""Background tasks: thin wrappers that take primitive ids and call a service.

The email tasks live in notifications.emails, beside the functions they call. A queued task is
stored with its dotted path and found again by it, so the tasks queued as
notifications.tasks.deliver_email(s)_task before that move still need these names here.
"""

from __future__ import annotations

from django_tasks import task

from notifications.emails import deliver_email_task, deliver_emails_task, send_email

__all__ = ["deliver_email_task", "deliver_emails_task", "deliver_webhook_task", "send_email_task"]


@task()
def deliver_webhook_task(delivery_id: int) -> str:
    from notifications import services

    delivery = services.attempt(delivery_id)
    return delivery.status if delivery else "skipped"


@task()
def send_email_task(audit_event_id: int, recipients: list[str]) -> int:
    """Kept for tasks queued before each email had a row: it only writes those rows."""
    return send_email(audit_event_id=audit_event_id, recipients=recipients)
