"""The hook: a committed audit event becomes deliveries and emails for the right events only."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain as audit
from approvals.decisions.decide import decide
from approvals.models import AuditEvent, Role, Ticket
from approvals.runs.reaper import reap
from notifications import fan_out
from notifications.events import event_for
from notifications.models import Delivery, DeliveryStatus, Event
from tests.notifications.conftest import make_endpoint
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

DELIVER_TASK = "notifications.deliveries.deliver_webhook_task"


def deliveries(endpoint) -> list[tuple[str, str]]:
    return list(
        Delivery.objects.filter(endpoint=endpoint)
        .order_by("pk")
        .values_list("event", "audit_event__action")
    )


@pytest.mark.parametrize(
    ("action", "detail", "outcome", "expected"),
    [
        ("ticket.created", {}, "", Event.TICKET_CREATED),
        ("ticket.approved", {}, "", Event.TICKET_DECIDED),
        ("ticket.rejected", {}, "", Event.TICKET_DECIDED),
        ("ticket.rejected", {"by": "expiry"}, "", Event.TICKET_EXPIRED),
        ("ticket.auto_approved", {}, "", Event.TICKET_DECIDED),
        ("ticket.auto_rejected", {}, "", Event.TICKET_DECIDED),
        ("ticket.preauthorised", {}, "approved", Event.TICKET_DECIDED),
        ("ticket.edited", {}, "rejected", Event.TICKET_DECIDED),
        ("ticket.expired", {}, "", Event.TICKET_EXPIRED),
        ("ticket.escalated", {}, "", Event.TICKET_ESCALATED),
        ("run.completed", {}, "", Event.RUN_COMPLETED),
        ("run.failed", {}, "", Event.RUN_FAILED),
        ("run.expired", {}, "", Event.RUN_FAILED),
        ("run.in_doubt", {}, "", Event.RUN_FAILED),
        ("run.paused", {}, "", None),
        ("run.queued", {}, "", None),
        ("ticket.vote", {}, "", None),
        ("ticket.claimed", {}, "", None),
        ("ticket.commented", {}, "", None),
        ("webhook.failed", {}, "", None),
        ("webhook.delivered", {}, "", None),
        ("email.failed", {}, "", None),
        ("email.retried", {}, "", None),
        ("auth.sign_in_failed", {}, "", None),
        ("audit.checkpointed", {}, "checkpointed", Event.AUDIT_CHECKPOINT),
    ],
)
def test_event_for_maps_audit_actions_to_notification_events(action, detail, outcome, expected):
    assert event_for(AuditEvent(action=action, detail=detail, outcome=outcome)) == expected


def test_fan_out_new_ticket_reaches_active_endpoints_that_want_it_only(
    tenant, admin, django_capture_on_commit_callbacks
):
    wants, _ = make_endpoint(tenant, admin, events=[Event.TICKET_CREATED])
    inactive, _ = make_endpoint(tenant, admin, events=[Event.TICKET_CREATED], active=False)
    other_event, _ = make_endpoint(tenant, admin, events=[Event.RUN_COMPLETED])
    elsewhere = TenantFactory(slug="globex")
    foreign, _ = make_endpoint(elsewhere, member(elsewhere, Role.ADMIN), events=list(Event))

    with django_capture_on_commit_callbacks(execute=True):
        paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="req"))

    assert deliveries(wants) == [("ticket.created", "ticket.created")]
    assert deliveries(inactive) == []
    assert deliveries(other_event) == []
    assert deliveries(foreign) == []
    delivery = Delivery.objects.get(endpoint=wants)
    assert delivery.status == DeliveryStatus.PENDING
    assert delivery.attempts == 0
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 1


def test_fan_out_decision_and_run_completion_reach_the_endpoint(
    tenant, admin, django_capture_on_commit_callbacks
):
    endpoint, _ = make_endpoint(tenant, admin)
    with django_capture_on_commit_callbacks(execute=True):
        run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="req"))
    ticket = Ticket.objects.get(run=run)

    with django_capture_on_commit_callbacks(execute=True):
        decide(ticket, user=member(tenant, Role.APPROVER), approve=False, message="no")

    # run.paused and run.queued notify no one; the rejection does.
    assert deliveries(endpoint) == [
        ("ticket.created", "ticket.created"),
        ("ticket.decided", "ticket.rejected"),
    ]


def test_fan_out_expiry_sends_ticket_expired_and_run_failed(
    tenant, admin, django_capture_on_commit_callbacks
):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.TICKET_EXPIRED, Event.RUN_FAILED])
    run = paused_run(tenant)
    Ticket.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))

    with django_capture_on_commit_callbacks(execute=True):
        reap()

    assert deliveries(endpoint) == [
        ("ticket.expired", "ticket.expired"),
        ("run.failed", "run.expired"),
    ]
    payload = Delivery.objects.filter(endpoint=endpoint).last().payload
    assert '"status":"expired"' in payload


def test_fan_out_nothing_for_a_rolled_back_transaction(
    tenant, admin, django_capture_on_commit_callbacks
):
    endpoint, _ = make_endpoint(tenant, admin)

    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")
        raise RuntimeError("rolled back")

    assert deliveries(endpoint) == []


def test_fan_out_a_failing_receiver_never_breaks_the_decision(
    tenant, admin, django_capture_on_commit_callbacks, monkeypatch
):
    make_endpoint(tenant, admin)
    run = paused_run(tenant)

    def broken(**kwargs):
        raise RuntimeError("notification store down")

    monkeypatch.setattr(fan_out, "fan_out", broken)
    with django_capture_on_commit_callbacks(execute=True):
        ticket = decide(
            Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER), approve=True
        )

    assert ticket.status == "approved"
    assert Delivery.objects.count() == 0


def test_fan_out_twice_for_one_event_delivers_once(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    with transaction.atomic():
        event = audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")

    fan_out.fan_out(audit_event=event)
    fan_out.fan_out(audit_event=event)

    assert deliveries(endpoint) == [("ticket.escalated", "ticket.escalated")]
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 1


def test_fan_out_without_endpoints_or_email_addresses_enqueues_nothing(
    tenant, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        paused_run(tenant, requested_by=member(tenant, Role.VIEWER))

    assert DBTaskResult.objects.count() == 0


# --- signed audit checkpoints (fan_out_checkpoint) ----------------------------------------------


def test_fan_out_of_the_checkpoint_audit_event_alone_sends_nothing(tenant, admin):
    """The plain fan-out has no statement to send: the checkpoint's own signal does."""
    endpoint, _ = make_endpoint(tenant, admin)
    with transaction.atomic():
        event = audit.append(
            tenant_id=tenant.pk, action="audit.checkpointed", outcome="checkpointed"
        )

    assert fan_out.fan_out(audit_event=event) == []
    assert deliveries(endpoint) == []


def test_fan_out_checkpoint_reaches_the_tenants_active_endpoints_that_subscribed(tenant, admin):
    wants, _ = make_endpoint(tenant, admin, events=[Event.AUDIT_CHECKPOINT])
    every, _ = make_endpoint(tenant, admin)
    inactive, _ = make_endpoint(tenant, admin, events=[Event.AUDIT_CHECKPOINT], active=False)
    not_subscribed, _ = make_endpoint(tenant, admin, events=[Event.TICKET_CREATED])
    elsewhere = TenantFactory(slug="globex")
    foreign, _ = make_endpoint(elsewhere, member(elsewhere, Role.ADMIN))
    with transaction.atomic():
        event = audit.append(
            tenant_id=tenant.pk, action="audit.checkpointed", outcome="checkpointed"
        )
    checkpoint = {"statement": {"tenant": "acme", "seq": 4}, "signature": "s", "public_key": "p"}

    created = fan_out.fan_out_checkpoint(audit_event=event, checkpoint=checkpoint)
    again = fan_out.fan_out_checkpoint(audit_event=event, checkpoint=checkpoint)

    assert [d.endpoint_id for d in created] == [wants.pk, every.pk]
    assert again == []
    assert deliveries(wants) == deliveries(every) == [("audit.checkpoint", "audit.checkpointed")]
    assert deliveries(inactive) == deliveries(not_subscribed) == deliveries(foreign) == []
    assert json.loads(created[0].payload) == {
        "id": f"acme:{event.seq}",
        "event": "audit.checkpoint",
        "action": "audit.checkpointed",
        "tenant": "acme",
        "checkpoint": checkpoint,
        "time": event.created_at.isoformat(),
        "url": "http://127.0.0.1:8000/audit/",
    }
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 2
