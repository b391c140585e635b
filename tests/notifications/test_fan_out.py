"""The fan-out: a committed audit event becomes deliveries and emails for the right events only,
in the worker's notifications pool (catch_up), never in the process that committed it."""

from __future__ import annotations

import contextlib
import importlib
import json
import threading
from datetime import timedelta

import pytest
from django.apps import apps as django_apps
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain as audit
from approvals.decisions.decide import decide
from approvals.models import AuditEvent, Role, Run, RunStatus, Tenant, Ticket
from approvals.runs.reaper import reap
from notifications import fan_out
from notifications.events import event_for, runs_named
from notifications.models import Delivery, DeliveryStatus, EmailDelivery, Event, FanOutCursor
from tests.notifications.conftest import fan_out_committed, make_endpoint
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

DELIVER_TASK = "notifications.deliveries.deliver_webhook_task"
EMAILS_TASK = "notifications.emails.deliver_emails_task"


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
    fan_out_committed()

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
    fan_out_committed()
    ticket = Ticket.objects.get(run=run)

    with django_capture_on_commit_callbacks(execute=True):
        decide(ticket, user=member(tenant, Role.APPROVER), approve=False, message="no")
    fan_out_committed()

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
    fan_out_committed()

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
    fan_out_committed()

    assert deliveries(endpoint) == []


def test_fan_out_that_raises_is_tried_again_then_skipped_and_never_breaks_the_decision(
    tenant, admin, django_capture_on_commit_callbacks, monkeypatch
):
    endpoint, _ = make_endpoint(tenant, admin)
    run = paused_run(tenant)
    fan_out_committed()
    real = fan_out.fan_out

    def broken(*, audit_event, **given):
        if audit_event.action == "ticket.approved":
            raise RuntimeError("notification store down")
        return real(audit_event=audit_event, **given)

    monkeypatch.setattr(fan_out, "fan_out", broken)
    with django_capture_on_commit_callbacks(execute=True):
        ticket = decide(
            Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER), approve=True
        )
    with transaction.atomic():
        audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")

    assert ticket.status == "approved"
    approved = AuditEvent.objects.get(tenant=tenant, action="ticket.approved")
    # Each pass stops at the event that fails, and the events after it wait.
    for failures in range(1, fan_out.MAX_FAILURES):
        fan_out_committed()
        cursor = FanOutCursor.objects.get(tenant=tenant)
        assert (cursor.seq, cursor.failures) == (approved.seq - 1, failures)
        assert deliveries(endpoint) == [("ticket.created", "ticket.created")]
    # The last try gives up on it: skipped with an error, and the tenant's fan-out goes on.
    fan_out_committed()

    cursor = FanOutCursor.objects.get(tenant=tenant)
    tenant.refresh_from_db()
    assert (cursor.seq, cursor.failures) == (tenant.audit_seq, 0)
    assert deliveries(endpoint) == [
        ("ticket.created", "ticket.created"),
        ("ticket.escalated", "ticket.escalated"),
    ]


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
    fan_out_committed()

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


# --- the worker's catch-up (catch_up): off the committing process -------------------------------


def notification_queries(queries) -> list[str]:
    return [q["sql"] for q in queries if "notifications_" in q["sql"]]


@pytest.mark.parametrize("action", ["pause", "decision"])
def test_fan_out_costs_the_committing_process_no_query(
    action, tenant, admin, django_capture_on_commit_callbacks
):
    make_endpoint(tenant, admin)
    requester = member(tenant, Role.VIEWER, username="req")
    approver = member(tenant, Role.APPROVER, username="ann")
    for user in (requester, approver):
        user.email = f"{user.username}@example.com"
        user.save()
    ticket = None if action == "pause" else Ticket.objects.get(run=paused_run(tenant))

    with (
        CaptureQueriesContext(connection) as queries,
        django_capture_on_commit_callbacks(execute=True) as hooks,
    ):
        if ticket is None:
            paused_run(tenant, requested_by=requester)
        else:
            decide(ticket, user=approver, approve=False, message="no")
        committed = len(queries.captured_queries)

    # Neither the transaction nor its after-commit hooks read or write a notification.
    assert hooks  # the hooks ran (audit signal, live hints) ...
    assert queries.captured_queries[committed:] == []  # ... and issued no query at all
    assert notification_queries(queries.captured_queries) == []
    assert Delivery.objects.count() == EmailDelivery.objects.count() == 0
    # The worker's pass fans it out.
    fan_out_committed()
    told = "ticket.created" if ticket is None else "ticket.rejected"
    assert Delivery.objects.filter(audit_event__action=told).count() == 1


def test_fan_out_catch_up_reads_each_tenants_events_in_order_and_moves_its_cursor(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    globex = TenantFactory(slug="globex")
    foreign, _ = make_endpoint(globex, member(globex, Role.ADMIN), events=[Event.TICKET_ESCALATED])
    fan_out_committed()  # the set-up's own events (webhook.created)
    for each in (tenant, globex, tenant):
        with transaction.atomic():
            audit.append(tenant_id=each.pk, action="ticket.escalated", actor_name="policy")

    assert fan_out_committed() == 3

    assert deliveries(endpoint) == [("ticket.escalated", "ticket.escalated")] * 2
    assert deliveries(foreign) == [("ticket.escalated", "ticket.escalated")]
    heads = sorted(Tenant.objects.values_list("slug", "audit_seq"))
    assert sorted(FanOutCursor.objects.values_list("tenant__slug", "seq")) == heads
    # Nothing new: the next pass reads the tenants behind (none) and nothing else.
    assert fan_out_committed() == 0
    assert Delivery.objects.count() == 3


def test_fan_out_catch_up_idle_costs_one_query(tenant, admin, django_assert_num_queries):
    make_endpoint(tenant, admin)
    with transaction.atomic():
        audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")
    fan_out_committed()

    with django_assert_num_queries(1):
        assert fan_out_committed() == 0


def test_fan_out_a_rolled_back_event_is_never_fanned_out_even_when_its_seq_is_reused(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    with pytest.raises(RuntimeError), transaction.atomic():
        ghost = audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="ghost")
        raise RuntimeError("rolled back")
    with transaction.atomic():
        real = audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")

    fan_out_committed()

    assert real.seq == ghost.seq
    (delivery,) = Delivery.objects.filter(endpoint=endpoint)
    assert delivery.audit_event_id == real.pk
    assert json.loads(delivery.payload)["actor"] == "policy"


def test_fan_out_catch_up_after_a_crash_mid_way_resumes_from_its_cursor(tenant, admin, monkeypatch):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.TICKET_ESCALATED])
    fan_out_committed()
    start = FanOutCursor.objects.get(tenant=tenant).seq
    with transaction.atomic():
        events = [
            audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name=f"p{n}")
            for n in range(3)
        ]
    real = fan_out.fan_out
    done = []

    def dies_at_the_second(*, audit_event, **given):
        if len(done) == 1:
            raise KeyboardInterrupt("the worker was killed")  # not an Exception: nothing catches it
        done.append(audit_event.pk)
        return real(audit_event=audit_event, **given)

    monkeypatch.setattr(fan_out, "fan_out", dies_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        fan_out_committed()
    # The crash left the cursor where it was.
    assert FanOutCursor.objects.get(tenant=tenant).seq == start
    assert deliveries(endpoint) == [("ticket.escalated", "ticket.escalated")]
    monkeypatch.setattr(fan_out, "fan_out", real)

    assert fan_out_committed() == 3

    # The first event, fanned out before the crash, is not sent twice.
    assert list(
        Delivery.objects.filter(endpoint=endpoint).order_by("pk").values_list("audit_event_id")
    ) == [(e.pk,) for e in events]
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 3
    assert FanOutCursor.objects.get(tenant=tenant).seq == events[-1].seq


def test_fan_out_catch_up_that_lost_the_race_keeps_the_winners_cursor(tenant, admin, monkeypatch):
    """One pass reads the cursor, another pass fans the same events out and moves the cursor
    on meanwhile: the first fans out nothing twice and never moves the cursor back."""
    endpoint, _ = make_endpoint(tenant, admin)
    fan_out_committed()
    with transaction.atomic():
        first = audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="a")
    real = fan_out.fan_out
    raced = []

    def overtaken(*, audit_event, **given):
        if not raced:
            raced.append(True)
            # The other worker's whole pass, and then one more event, while this one is here.
            assert fan_out.catch_up() == 1
            with transaction.atomic():
                audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="b")
            assert fan_out.catch_up() == 1
        return real(audit_event=audit_event, **given)

    monkeypatch.setattr(fan_out, "fan_out", overtaken)
    fan_out.catch_up()

    assert deliveries(endpoint) == [("ticket.escalated", "ticket.escalated")] * 2
    assert Delivery.objects.filter(audit_event_id=first.pk).count() == 1
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 2
    assert FanOutCursor.objects.get(tenant=tenant).seq == first.seq + 1


def test_fan_out_cursors_made_by_the_migration_start_at_the_chains_head(tenant, admin):
    """Existing tenants are not back-filled on deploy: their history was fanned out by the code
    that wrote it. A tenant made later has no cursor, and is read from its first event."""
    endpoint, _ = make_endpoint(tenant, admin)
    with transaction.atomic():
        audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="old")
    migration = importlib.import_module("notifications.migrations.0005_fan_out_cursor")
    migration.start_at_the_heads(django_apps, None)
    newcomer = TenantFactory(slug="newcomer")
    fresh, _ = make_endpoint(newcomer, member(newcomer, Role.ADMIN))
    for each in (tenant, newcomer):
        with transaction.atomic():
            audit.append(tenant_id=each.pk, action="ticket.escalated", actor_name="new")

    fan_out_committed()

    assert [json.loads(d.payload)["actor"] for d in Delivery.objects.filter(endpoint=endpoint)] == [
        "new"
    ]
    assert [json.loads(d.payload)["actor"] for d in Delivery.objects.filter(endpoint=fresh)] == [
        "new"
    ]


@pytest.mark.django_db(transaction=True)
def test_fan_out_two_catch_ups_at_once_fan_out_once(monkeypatch):
    """Two workers' passes read the same cursor and fan out the same events at the same time
    (on SQLite, or had a pass not the tenant's lock): one delivery per endpoint and event, one
    email per recipient, one task for each."""
    monkeypatch.setattr(fan_out, "_tenant_pass", lambda tenant_id: contextlib.nullcontext(True))
    tenant = TenantFactory(slug="acme")
    admin = member(tenant, Role.ADMIN, username="boss")
    admin.email = "boss@example.com"
    admin.save()
    endpoint, _ = make_endpoint(tenant, admin)
    fan_out.catch_up()
    with transaction.atomic():
        for _ in range(3):
            audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")
    real = fan_out.fan_out
    both_read = threading.Barrier(2, timeout=30)
    local = threading.local()
    errors = []

    def racing(*, audit_event, **given):
        if audit_event.actor_name == "policy" and not hasattr(local, "waited"):
            local.waited = True
            both_read.wait()  # each pass has read the cursor and the events before any writes
        return real(audit_event=audit_event, **given)

    def worker():
        try:
            fan_out.catch_up()
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    fan_out.fan_out = racing
    try:
        threads = [threading.Thread(target=worker) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        fan_out.fan_out = real

    assert errors == []
    assert Delivery.objects.filter(endpoint=endpoint).count() == 3
    assert EmailDelivery.objects.filter(recipient="boss@example.com").count() == 3
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 3
    assert DBTaskResult.objects.filter(task_path=EMAILS_TASK).count() == 3
    tenant.refresh_from_db()
    assert FanOutCursor.objects.get(tenant=tenant).seq == tenant.audit_seq


@pytest.mark.skipif(connection.vendor != "postgresql", reason="advisory locks are PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_fan_out_passes_by_a_tenant_another_workers_pass_is_fanning_out():
    """While one pass holds a tenant, another worker's pass fans out the other tenants and
    leaves that one's events and cursor alone; the next pass after it takes them, once."""
    busy, idle = TenantFactory(slug="busy"), TenantFactory(slug="idle")
    busy_endpoint, _ = make_endpoint(busy, member(busy, Role.ADMIN))
    idle_endpoint, _ = make_endpoint(idle, member(idle, Role.ADMIN))
    fan_out.catch_up()
    for each in (busy, idle):
        with transaction.atomic():
            audit.append(tenant_id=each.pk, action="ticket.escalated", actor_name="policy")
    busy_cursor = FanOutCursor.objects.get(tenant=busy).seq
    inside, leave = threading.Event(), threading.Event()
    real = fan_out.fan_out

    def holding(*, audit_event, **given):
        if audit_event.tenant_id == busy.pk and not inside.is_set():
            inside.set()
            assert leave.wait(timeout=30)
        return real(audit_event=audit_event, **given)

    def other_worker():
        try:
            fan_out._catch_up_tenant(busy.pk, busy_cursor, 0, 100)
        finally:
            connection.close()

    fan_out.fan_out = holding
    try:
        thread = threading.Thread(target=other_worker)
        thread.start()
        assert inside.wait(timeout=30)
        passed = fan_out.catch_up()
        during = (deliveries(busy_endpoint), deliveries(idle_endpoint))
        cursor_during = FanOutCursor.objects.get(tenant=busy).seq
        leave.set()
        thread.join(timeout=60)
    finally:
        leave.set()
        fan_out.fan_out = real

    assert passed == 1  # the idle tenant's event only
    assert during == ([], [("ticket.escalated", "ticket.escalated")])
    assert cursor_during == busy_cursor
    assert deliveries(busy_endpoint) == [("ticket.escalated", "ticket.escalated")]
    assert FanOutCursor.objects.get(tenant=busy).seq == busy_cursor + 1
    assert fan_out.catch_up() == 0
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 2


# --- what a pass reads ---------------------------------------------------------------------------


def _queries_of(tables: tuple[str, ...], captured) -> list[str]:
    return [q["sql"] for q in captured if any(f'FROM "{t}"' in q["sql"] for t in tables)]


def test_fan_out_a_pass_reads_the_tenants_endpoints_once_for_all_its_events(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.TICKET_ESCALATED])
    fan_out_committed()
    for _ in range(3):
        with transaction.atomic():
            audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")

    with CaptureQueriesContext(connection) as captured:
        assert fan_out_committed() == 3

    assert len(_queries_of(("notifications_webhookendpoint",), captured.captured_queries)) == 1
    assert deliveries(endpoint) == [("ticket.escalated", "ticket.escalated")] * 3


def test_fan_out_a_pass_uses_the_endpoints_as_they_were_at_its_start(tenant, admin, monkeypatch):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.TICKET_ESCALATED])
    late, _ = make_endpoint(tenant, admin, events=[Event.TICKET_ESCALATED], active=False)
    fan_out_committed()
    for _ in range(2):
        with transaction.atomic():
            audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="policy")
    told = []
    real = fan_out.fan_out

    def fan_out_then_activate(**kwargs):
        told.append([e.pk for e in kwargs["endpoints"]])
        # Activated mid-pass: this pass goes on with the endpoints it read at its start.
        type(late).objects.filter(pk=late.pk).update(active=True)
        return real(**kwargs)

    monkeypatch.setattr(fan_out, "fan_out", fan_out_then_activate)
    fan_out_committed()

    assert told == [[endpoint.pk], [endpoint.pk]]
    assert deliveries(late) == []


def test_fan_out_reads_a_runs_outcome_only_when_someone_is_told(
    tenant, django_capture_on_commit_callbacks
):
    # Nobody to tell: no endpoint, and the requester has no email address.
    requester = member(tenant, Role.VIEWER, username="req")
    requester.email = ""
    requester.save(update_fields=["email"])
    with django_capture_on_commit_callbacks(execute=True):
        run = paused_run(tenant, requested_by=requester)
    fan_out_committed()
    with transaction.atomic():
        event = audit.append(
            tenant_id=tenant.pk, action="run.completed", run_id=run.pk, outcome="completed"
        )

    with CaptureQueriesContext(connection) as captured:
        assert fan_out.fan_out(audit_event=event) == []

    # The run (for who is told); neither its tickets nor their votes (its outcome).
    outcome_reads = _queries_of(
        ("approvals_ticket", "approvals_ticketvote"), captured.captured_queries
    )
    assert outcome_reads == []
    assert EmailDelivery.objects.count() == 0


def test_fan_out_tells_a_runs_outcome_when_someone_is_told(
    tenant, admin, django_capture_on_commit_callbacks
):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.RUN_COMPLETED])
    with django_capture_on_commit_callbacks(execute=True):
        run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="req"))
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=member(tenant, Role.APPROVER, username="ann"), approve=False, message="no")
    fan_out_committed()
    with transaction.atomic():
        event = audit.append(
            tenant_id=tenant.pk, action="run.completed", run_id=run.pk, outcome="completed"
        )

    fan_out.fan_out(audit_event=event)

    payload = json.loads(Delivery.objects.get(endpoint=endpoint).payload)
    assert [(d["ticket"], d["decision"], d["message"]) for d in payload["decisions"]] == [
        (ticket.pk, "rejected", "no")
    ]


def test_fan_out_a_pass_reads_each_persons_address_once_for_all_its_events(
    tenant, django_capture_on_commit_callbacks
):
    requester = member(tenant, Role.VIEWER, username="req")
    requester.email = "req@example.com"
    requester.save(update_fields=["email"])
    with django_capture_on_commit_callbacks(execute=True):
        runs = [paused_run(tenant, requested_by=requester) for _ in range(3)]
    fan_out_committed()
    for run in runs:
        with transaction.atomic():
            audit.append(
                tenant_id=tenant.pk, action="run.completed", run_id=run.pk, outcome="completed"
            )

    with CaptureQueriesContext(connection) as captured:
        assert fan_out_committed() == 3

    address_reads = [
        q for q in _queries_of(("auth_user",), captured.captured_queries) if '"email"' in q
    ]
    assert len(address_reads) == 1, address_reads
    assert sorted(EmailDelivery.objects.values_list("audit_event__run_id", "recipient")) == sorted(
        (run.pk, "req@example.com") for run in runs
    )


@pytest.mark.parametrize("end_first", [False, True])
def test_fan_out_a_pass_reads_its_events_runs_once_for_all_of_them(
    tenant, admin, django_capture_on_commit_callbacks, end_first
):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.RUN_COMPLETED, Event.TICKET_ESCALATED])
    requester = member(tenant, Role.VIEWER, username="req")
    with django_capture_on_commit_callbacks(execute=True):
        runs = [paused_run(tenant, requested_by=requester) for _ in range(3)]
    for run in runs:
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.COMPLETED, final_output=f"Release of run {run.pk} is live."
        )
    fan_out_committed()
    actions = ["ticket.escalated", "run.completed"]
    for run in runs:
        with transaction.atomic():
            for action in reversed(actions) if end_first else actions:
                audit.append(tenant_id=tenant.pk, action=action, run_id=run.pk, outcome="x")

    with CaptureQueriesContext(connection) as captured:
        assert fan_out_committed() == 6

    # The runs with an end among the pass's events, then the others (none here): whatever the
    # order of a run's events, each field a notification says is read with them.
    run_reads = _queries_of(("approvals_run",), captured.captured_queries)
    assert len(run_reads) == 1, run_reads
    payloads = [json.loads(d.payload) for d in Delivery.objects.filter(endpoint=endpoint)]
    assert sorted((p["event"], p["run"], p["run_title"]) for p in payloads) == sorted(
        (event, run.pk, run.title) for run in runs for event in actions
    )
    assert sorted(p["output"] for p in payloads if p["event"] == "run.completed") == sorted(
        f"Release of run {run.pk} is live." for run in runs
    )


def test_fan_out_an_event_naming_another_tenants_run_says_nothing_of_it(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.RUN_COMPLETED])
    other = TenantFactory(slug="other")
    theirs = paused_run(other, requested_by=member(other, Role.VIEWER, username="them"))
    ours = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="req"))
    fan_out_committed()
    with transaction.atomic():
        for run in (ours, theirs):
            audit.append(
                tenant_id=tenant.pk, action="run.completed", run_id=run.pk, outcome="completed"
            )

    assert fan_out_committed() == 2

    titles = {
        p["run"]: p["run_title"]
        for p in (json.loads(d.payload) for d in Delivery.objects.filter(endpoint=endpoint))
    }
    assert titles == {ours.pk: ours.title, theirs.pk: ""}
    runs = runs_named(tenant.pk, AuditEvent.objects.filter(tenant=tenant))
    assert set(runs) == {ours.pk}


def test_fan_out_an_event_whose_run_the_pass_did_not_read_reads_it_itself(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.RUN_COMPLETED])
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="req"))
    fan_out_committed()
    with transaction.atomic():
        event = audit.append(
            tenant_id=tenant.pk, action="run.completed", run_id=run.pk, outcome="completed"
        )

    fan_out.fan_out(audit_event=event, runs={})

    assert json.loads(Delivery.objects.get(endpoint=endpoint).payload)["run_title"] == run.title
