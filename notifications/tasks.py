"""Background tasks: thin wrappers that take primitive ids and call a service."""

from __future__ import annotations

from django_tasks import task


@task()
def deliver_webhook_task(delivery_id: int) -> str:
    from notifications import services

    delivery = services.attempt(delivery_id)
    return delivery.status if delivery else "skipped"


@task()
def deliver_email_task(email_id: int) -> str:
    from notifications import services

    email = services.attempt_email(email_id)
    return email.status if email else "skipped"


@task()
def deliver_emails_task(email_ids: list[int]) -> int:
    """The emails of one event, sent over one SMTP connection; retries go one by one."""
    from notifications import services

    return len(services.attempt_emails(email_ids))


@task()
def send_email_task(audit_event_id: int, recipients: list[str]) -> int:
    """Kept for tasks queued before each email had a row: it only writes those rows."""
    from notifications import services

    return services.send_email(audit_event_id=audit_event_id, recipients=recipients)
