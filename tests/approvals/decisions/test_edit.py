"""Edit and approve: the original call rejected with corrected arguments, exactly those
pre-authorised once, the model's new call approved in the editor's name, any other call a
normal ticket; the diff shown wherever the decision appears."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from agents import Agent, function_tool
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django_tasks_db.models import DBTaskResult

from approvals.core.canonical import arguments_digest
from approvals.decisions import calls, edit, preauth
from approvals.decisions.decide import decide
from approvals.decisions.edit import edit_and_approve
from approvals.decisions.errors import (
    AlreadyDecidedError,
    AlreadyVotedError,
    InvalidArgumentsError,
    InvalidDecisionError,
    NotAllowedError,
    SelfApprovalError,
    TicketNotFoundError,
    ToolUnavailableError,
)
from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    PreAuthorization,
    Role,
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
)
from approvals.policies.groups import save_group
from approvals.policies.versions import save_policy
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db
# The worker resumes in a thread of its own, which needs committed rows.
RESUMES = pytest.mark.django_db(transaction=True)

ORIGINAL = {"environment": "production", "release": "2026.07.24"}
EDITED = {"environment": "production", "release": "2026.07.25"}
EDITED_JSON = '{"environment":"production","release":"2026.07.25"}'


@pytest.fixture(autouse=True)
def model_calls(monkeypatch) -> dict[str, int]:
    monkeypatch.setitem(demo.MODEL_CALLS, "release", 0)
    return demo.MODEL_CALLS


@pytest.fixture
def setup():
    tenant = TenantFactory()
    requester = member(tenant, Role.VIEWER, username="requester")
    approver = member(tenant, Role.APPROVER, username="approver")
    run = paused_run(tenant, requested_by=requester)
    return tenant, Ticket.objects.get(run=run), approver


def actions(run: Run) -> list[str]:
    return list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    )


# --- the service ------------------------------------------------------------------------------


def test_edit_and_approve_rejects_the_original_with_the_corrected_arguments(setup):
    _, ticket, approver = setup

    pre = edit_and_approve(ticket, user=approver, arguments=EDITED, message="Use .25")

    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.REJECTED
    assert ticket.decided_by == approver
    assert ticket.decision_message == (
        "The approver changed the arguments. Call deploy_release again with exactly these "
        f"arguments: {EDITED_JSON}\nNote from the approver: Use .25"
    )
    assert (pre.run_id, pre.tool_name, pre.original_ticket_id) == (
        ticket.run_id,
        "deploy_release",
        ticket.pk,
    )
    assert pre.arguments_json == EDITED_JSON
    assert pre.arguments_digest == arguments_digest(EDITED_JSON)
    assert (pre.created_by, pre.used_by, pre.expires_at > ticket.decided_at) == (
        approver,
        None,
        True,
    )
    edited = AuditEvent.objects.get(action="ticket.edited")
    assert (edited.ticket_id, edited.actor_name, edited.outcome) == (
        ticket.pk,
        "approver",
        "rejected",
    )
    assert edited.arguments_digest == ticket.arguments_digest
    assert edited.detail["edited_digest"] == pre.arguments_digest
    assert edited.detail["changes"] == [
        {
            "path": "release",
            "kind": "changed",
            "before": '"2026.07.24"',
            "after": '"2026.07.25"',
        }
    ]
    assert edited.detail["message"] == "Use .25"
    run = Run.objects.get(pk=ticket.run_id)
    assert run.status == RunStatus.QUEUED
    assert actions(run)[-2:] == ["ticket.edited", "run.queued"]
    assert not AuditEvent.objects.filter(action="ticket.rejected").exists()


def test_edit_and_approve_names_the_edited_release_in_the_run_title(setup):
    _, ticket, approver = setup
    assert ticket.run.title == "Deploy release 2026.07.24 to production"

    edit_and_approve(ticket, user=approver, arguments=EDITED)

    assert Run.objects.get(pk=ticket.run_id).title == "Deploy release 2026.07.25 to production"


def test_retitled_keeps_a_title_naming_no_edited_value_and_never_takes_a_secret():
    before = {"release": "2026.07.24", "environment": "staging", "token": "old-token"}

    assert edit.retitled("Ship it", before=before, after={**before, "release": "2026.07.25"}) == (
        "Ship it"
    )
    assert (
        edit.retitled(
            "Deploy 2026.07.24 to staging with old-token",
            before=before,
            after={**before, "environment": "production", "token": "new-token"},
        )
        == "Deploy 2026.07.24 to production with old-token"
    )
    secret = "sk-" + "a" * 40
    assert (
        edit.retitled("Deploy 2026.07.24", before=before, after={**before, "release": secret})
        == "Deploy 2026.07.24"
    )


@RESUMES
def test_edit_and_approve_end_to_end_runs_the_edited_release_once(setup, model_calls):
    _, ticket, approver = setup
    edit_and_approve(ticket, user=approver, arguments=EDITED)

    first = resume(run_id=ticket.run_id, worker_id="w1")

    # The model called again with exactly the edited arguments: approved at once, queued again.
    assert first.status == RunStatus.PAUSED
    run = Run.objects.get(pk=ticket.run_id)
    assert run.status == RunStatus.QUEUED
    new = Ticket.objects.get(run=run, generation=2)
    assert (new.status, new.decided_by, new.arguments_json) == (
        TicketStatus.APPROVED,
        approver,
        EDITED_JSON,
    )
    assert new.tool_call_id == f"{ticket.tool_call_id}_edited"
    assert new.decision_message == f"Pre-authorised by approver: edited from ticket #{ticket.pk}."
    pre = PreAuthorization.objects.get(original_ticket=ticket)
    assert pre.used_by == new
    event = AuditEvent.objects.get(action="ticket.preauthorised")
    assert (event.ticket_id, event.actor_id, event.actor_name, event.outcome) == (
        new.pk,
        approver.pk,
        "approver",
        "approved",
    )
    assert event.detail["preauthorised_by"] == "approver"
    assert event.detail["original_ticket"] == ticket.pk
    assert event.detail["changes"][0]["after"] == '"2026.07.25"'
    assert demo.read_effects() == []

    final = resume(run_id=run.pk, worker_id="w2")

    run.refresh_from_db()
    assert final.status == RunStatus.COMPLETED
    effects = demo.read_effects("deploy_release")
    assert [(e["release"], e["environment"]) for e in effects] == [("2026.07.25", "production")]
    record = IdempotencyRecord.objects.get(run=run)
    assert (record.resource, record.ticket_id, record.status) == (
        "2026.07.25@production",
        new.pk,
        "done",
    )
    assert run.final_output == "Release 2026.07.25: Release 2026.07.25 is live on production."
    assert actions(run) == [
        "run.paused",
        "ticket.created",
        "ticket.edited",
        "run.queued",
        "run.resuming",
        "run.paused",
        "ticket.created",
        "ticket.preauthorised",
        "run.queued",
        "run.resuming",
        "effect.done",
        "run.completed",
    ]
    assert model_calls["release"] == 3


def contrary_responder(call):
    """After a correction it calls the tool with other arguments than those it was given."""
    outputs = {
        item["call_id"]: str(item.get("output"))
        for item in call.input
        if isinstance(call.input, list)
        and isinstance(item, dict)
        and item.get("type") == "function_call_output"
    }
    if "call_first" not in outputs:
        return [function_call("deploy_release", ORIGINAL, call_id="call_first")]
    if "call_second" not in outputs:
        correction = edit.parse_correction(outputs["call_first"])
        arguments = {**correction.arguments, "environment": "staging"}
        return [function_call("deploy_release", arguments, call_id="call_second")]
    return [assistant_message(outputs["call_second"])]


def build_contrary_agent() -> Agent:
    return Agent(
        name="release",
        model=ScriptedModel([ModelStep.respond(contrary_responder) for _ in range(5)]),
        tools=[demo.deploy_release],
    )


@RESUMES
def test_edit_and_approve_other_arguments_make_a_normal_pending_ticket(settings):
    settings.APPROVALS_AGENTS = {
        **settings.APPROVALS_AGENTS,
        "contrary": {"1": "tests.approvals.decisions.test_edit.build_contrary_agent"},
    }
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER, username="approver")
    run = paused_run(tenant, agent_key="contrary", requested_by=member(tenant, Role.VIEWER))
    ticket = Ticket.objects.get(run=run)
    edit_and_approve(ticket, user=approver, arguments=EDITED)

    outcome = resume(run_id=run.pk, worker_id="w1")

    run.refresh_from_db()
    assert (outcome.status, run.status) == (RunStatus.PAUSED, RunStatus.PAUSED)
    new = Ticket.objects.get(run=run, generation=2)
    assert new.status == TicketStatus.PENDING
    assert json.loads(new.arguments_json) == {**EDITED, "environment": "staging"}
    assert PreAuthorization.objects.get(original_ticket=ticket).used_by is None
    assert not AuditEvent.objects.filter(action="ticket.preauthorised").exists()
    assert demo.read_effects() == []


@RESUMES
def test_a_preauthorisation_is_used_at_most_once(setup):
    _, ticket, approver = setup
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    resume(run_id=ticket.run_id, worker_id="w1")
    used = Ticket.objects.get(run_id=ticket.run_id, generation=2)
    assert PreAuthorization.objects.get(pk=pre.pk).used_by == used

    # The same call again (another ticket of the run, same tool and digest) is not approved.
    again = Ticket.objects.create(
        run_id=ticket.run_id,
        tenant_id=ticket.tenant_id,
        generation=3,
        tool_name="deploy_release",
        tool_call_id="call_again",
        arguments_json=EDITED_JSON,
        arguments_digest=arguments_digest(EDITED_JSON),
        requested_by=ticket.requested_by,
        expires_at=used.expires_at,
    )
    from django.db import transaction

    with transaction.atomic():
        assert (
            preauth.candidate(Run.objects.get(pk=ticket.run_id), again, now=timezone.now()) is None
        )
    assert Ticket.objects.get(pk=again.pk).status == TicketStatus.PENDING
    assert AuditEvent.objects.filter(action="ticket.preauthorised").count() == 1


def test_spending_a_preauthorisation_is_a_compare_and_set_that_only_one_ticket_wins(setup):
    """Two resumes that both found the pre-authorisation unused (each holds its own copy of
    the row) race to spend it: the first wins, the second is told no and changes nothing."""
    _, ticket, approver = setup
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    first_copy = PreAuthorization.objects.get(pk=pre.pk)
    second_copy = PreAuthorization.objects.get(pk=pre.pk)
    tickets = [
        Ticket.objects.create(
            run_id=ticket.run_id,
            tenant_id=ticket.tenant_id,
            generation=2,
            tool_name="deploy_release",
            tool_call_id=f"call_{n}",
            arguments_json=EDITED_JSON,
            arguments_digest=arguments_digest(EDITED_JSON),
            requested_by=ticket.requested_by,
            expires_at=pre.expires_at,
        )
        for n in (1, 2)
    ]
    now = timezone.now()

    assert preauth.use(first_copy, tickets[0], now=now) is True
    assert preauth.use(second_copy, tickets[1], now=now) is False

    assert PreAuthorization.objects.get(pk=pre.pk).used_by_id == tickets[0].pk
    assert second_copy.used_by is None


@RESUMES
def test_a_preauthorisation_is_not_used_after_it_expires(setup):
    _, ticket, approver = setup
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    PreAuthorization.objects.filter(pk=pre.pk).update(expires_at=pre.created_at)

    resume(run_id=ticket.run_id, worker_id="w1")

    new = Ticket.objects.get(run_id=ticket.run_id, generation=2)
    assert new.status == TicketStatus.PENDING
    assert PreAuthorization.objects.get(pk=pre.pk).used_by is None


@RESUMES
def test_a_preauthorisation_of_a_former_approver_is_not_used(setup):
    tenant, ticket, approver = setup
    edit_and_approve(ticket, user=approver, arguments=EDITED)
    approver.memberships.filter(tenant=tenant).update(role=Role.VIEWER)

    resume(run_id=ticket.run_id, worker_id="w1")

    new = Ticket.objects.get(run_id=ticket.run_id, generation=2)
    assert new.status == TicketStatus.PENDING


def test_edit_and_approve_by_the_requester_is_refused(setup):
    tenant, _, _ = setup
    requester = member(tenant, Role.APPROVER, username="approving-requester")
    ticket = Ticket.objects.get(run=paused_run(tenant, requested_by=requester))

    with pytest.raises(SelfApprovalError):
        edit_and_approve(ticket, user=requester, arguments=EDITED)

    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert not PreAuthorization.objects.exists()


def test_edit_and_approve_by_another_tenant_is_not_found(setup):
    _, ticket, _ = setup
    stranger = member(TenantFactory(), Role.ADMIN)

    with pytest.raises(TicketNotFoundError):
        edit_and_approve(ticket, user=stranger, arguments=EDITED)

    assert not PreAuthorization.objects.exists()


def test_edit_and_approve_by_a_viewer_is_not_allowed(setup):
    tenant, ticket, _ = setup

    with pytest.raises(NotAllowedError):
        edit_and_approve(ticket, user=member(tenant, Role.VIEWER), arguments=EDITED)


def test_edit_and_approve_of_a_decided_ticket_is_refused(setup):
    tenant, ticket, approver = setup
    decide(ticket, user=member(tenant, Role.ADMIN), approve=False)

    with pytest.raises(AlreadyDecidedError):
        edit_and_approve(ticket, user=approver, arguments=EDITED)

    assert not PreAuthorization.objects.exists()
    assert not AuditEvent.objects.filter(action="ticket.edited").exists()


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"release": 25, "environment": "production"}, ("release", "Must be text, not 25.")),
        ({"environment": "production"}, ("release", "This argument is required.")),
        (
            {**EDITED, "force": True},
            (
                None,
                "The tool takes no argument called 'force'; it takes environment, release.",
            ),
        ),
    ],
    ids=["wrong-type", "missing", "unknown"],
)
def test_edit_and_approve_refuses_arguments_outside_the_schema(setup, arguments, expected):
    _, ticket, approver = setup

    with pytest.raises(InvalidArgumentsError) as raised:
        edit_and_approve(ticket, user=approver, arguments=arguments)

    assert [(p.argument, p.message) for p in raised.value.problems] == [expected]
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert not PreAuthorization.objects.exists()


def deeply_nested(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def test_edit_and_approve_refuses_arguments_nested_too_deeply(setup):
    _, ticket, approver = setup
    arguments = {**EDITED, "release": deeply_nested(100_000)}

    with pytest.raises(InvalidArgumentsError) as raised:
        edit_and_approve(ticket, user=approver, arguments=arguments)

    [problem] = raised.value.problems
    assert problem.argument == "release"
    assert "nested too deeply" in problem.message
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert not PreAuthorization.objects.exists()


def test_the_schema_check_does_not_recurse_without_bound():
    # A recursive schema would make the validator descend once per level of the value.
    schema = {
        "type": "object",
        "properties": {"tree": {"$ref": "#/$defs/tree"}},
        "$defs": {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
    }

    problems = calls.schema_problems(schema, {"tree": deeply_nested(5_000)})

    assert [p.argument for p in problems] == ["tree"]
    assert "nested too deeply" in problems[0].message
    assert calls.schema_problems(schema, {"tree": deeply_nested(calls.MAX_DEPTH - 1)}) == []
    assert calls.schema_problems(schema, {"tree": deeply_nested(calls.MAX_DEPTH)}) != []


def test_edit_and_approve_with_unchanged_arguments_is_refused(setup):
    _, ticket, approver = setup

    with pytest.raises(InvalidDecisionError, match="approve the call instead"):
        edit_and_approve(ticket, user=approver, arguments=dict(ORIGINAL))


def test_parse_correction_reads_back_what_the_message_carries():
    text = edit.correction_message("deploy_release", EDITED_JSON, "a note: {not json}")

    correction = edit.parse_correction(text)

    assert (correction.tool, correction.arguments) == ("deploy_release", EDITED)
    assert edit.parse_correction("Deployment was denied.") is None


def test_changes_hide_values_of_secret_named_arguments():
    rows = preauth.changes({"api_key": "old", "n": 1}, {"api_key": "new", "n": 2})

    assert rows == [
        {"path": "api_key", "kind": "changed", "before": "[redacted]", "after": "[redacted]"},
        {"path": "n", "kind": "changed", "before": "1", "after": "2"},
    ]


# --- the views --------------------------------------------------------------------------------


@function_tool(needs_approval=True, failure_error_function=None)
def scale_service(
    service: str,
    replicas: int,
    region: Literal["eu", "us"],
    dry_run: bool,
    labels: list[str] | None = None,
) -> str:
    """Scale a service (a tool with every kind of argument, for the form)."""
    return f"{service} scaled to {replicas} in {region}"


SCALE = {"service": "api", "replicas": 2, "region": "eu", "dry_run": False, "labels": None}


def build_scaler_agent() -> Agent:
    return Agent(
        name="scaler",
        model=ScriptedModel(
            [
                [function_call("scale_service", SCALE, call_id="call_scale")],
                [assistant_message("ok")],
            ]
        ),
        tools=[scale_service],
    )


@pytest.fixture
def scaler(settings):
    settings.APPROVALS_AGENTS = {
        **settings.APPROVALS_AGENTS,
        "scaler": {"1": "tests.approvals.decisions.test_edit.build_scaler_agent"},
    }
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER, username="approver")
    run = paused_run(tenant, agent_key="scaler", requested_by=member(tenant, Role.VIEWER))
    return Ticket.objects.get(run=run), approver


def edit_url(ticket: Ticket) -> str:
    return reverse("approvals:edit", args=[ticket.pk])


def scale_form(**changes: str) -> dict[str, str]:
    form = {
        "arg__service": "api",
        "arg__replicas": "2",
        "arg__region": '"eu"',
        "arg__dry_run": "false",
        "arg__labels": "null",
        "extra": "",
        "message": "",
    }
    return {**form, **changes}


def test_edit_form_shows_one_field_per_argument_with_the_calls_values(client, scaler):
    ticket, approver = scaler
    client.force_login(approver)

    response = client.get(edit_url(ticket))

    assert response.status_code == 200
    page = response.content.decode()
    assert 'name="arg__service" value="api"' in page
    assert 'name="arg__replicas" value="2"' in page
    assert '<option value="&quot;eu&quot;" selected>eu</option>' in page
    assert '<option value="false" selected>false</option>' in page
    assert '<textarea name="arg__labels"' in page
    assert "This tool takes no other arguments." in page


def test_edit_page_names_the_same_baseline_as_the_ticket_page(client, setup):
    tenant, ticket, approver = setup
    earlier = []
    for prompt in (
        "Deploy release 2026.07.20 to production",
        "Deploy release 2026.07.21 to staging",
    ):
        run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER), prompt=prompt)
        earlier.append(decide(Ticket.objects.get(run=run), user=approver, approve=True))
    client.force_login(approver)

    edit_page = client.get(edit_url(ticket))
    ticket_page = client.get(reverse("approvals:ticket", args=[ticket.pk]))

    production = earlier[0]
    assert edit_page.context["baseline"].ticket == production
    assert ticket_page.context["baseline"].ticket == production
    assert (
        f'Last approved for environment &quot;production&quot;: <a href="/tickets/{production.pk}/">'
        f"#{production.pk}</a>, approved by approver on"
    ) in edit_page.content.decode()
    assert "this call differs in <code>release</code>." in edit_page.content.decode()


def test_edit_link_is_on_the_ticket_page_for_an_approver_only(client, setup):
    tenant, ticket, approver = setup
    client.force_login(approver)
    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    assert f'href="{edit_url(ticket)}" id="edit-and-approve"' in page

    client.force_login(member(tenant, Role.VIEWER))
    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    assert "edit-and-approve" not in page


def test_edit_post_rejects_pre_authorises_and_redirects_to_the_run(client, scaler):
    ticket, approver = scaler
    client.force_login(approver)

    response = client.post(
        edit_url(ticket),
        scale_form(arg__replicas="5", arg__labels='["ops"]', message="Five, not two."),
    )

    assert response.status_code == 302
    assert response["Location"] == reverse("approvals:run", args=[ticket.run_id])
    pre = PreAuthorization.objects.get(original_ticket=ticket)
    assert json.loads(pre.arguments_json) == {**SCALE, "replicas": 5, "labels": ["ops"]}
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.REJECTED
    assert ticket.decision_message.endswith("\nNote from the approver: Five, not two.")
    assert Run.objects.get(pk=ticket.run_id).status == RunStatus.QUEUED


@pytest.mark.parametrize(
    ("changes", "field", "error"),
    [
        (
            {"arg__replicas": "three"},
            "arg__replicas",
            "Must be a whole number, not &quot;three&quot;.",
        ),
        ({"arg__service": ""}, "arg__service", "This argument is required."),
        (
            {"extra": '{"force": true}'},
            "extra",
            "The tool takes no argument called &#x27;force&#x27;; it takes dry_run, labels, "
            "region, replicas, service.",
        ),
        ({"arg__labels": "[ops]"}, "arg__labels", "This is not valid JSON"),
        ({"arg__labels": '["ops", 7]'}, "arg__labels", "labels[1]: Must be text, not 7."),
        ({"arg__region": '"mars"'}, "arg__region", "Select a valid choice."),
        ({"extra": "[1]"}, "extra", "Other arguments must be a JSON object"),
    ],
    ids=["wrong-type", "missing", "unknown", "bad-json", "nested-type", "enum", "extra-list"],
)
def test_edit_post_outside_the_schema_is_a_form_error_and_keeps_what_was_typed(
    client, scaler, changes, field, error
):
    ticket, approver = scaler
    client.force_login(approver)
    data = scale_form(message="keep this note", **changes)

    response = client.post(edit_url(ticket), data)

    assert response.status_code == 400
    page = response.content.decode()
    assert f'id="{field}-error">{error}' in page
    assert "keep this note" in page
    for name, value in changes.items():
        if name.startswith("arg__") and name != "arg__region":
            assert escape(value) in page
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert not PreAuthorization.objects.exists()
    assert not AuditEvent.objects.filter(action="ticket.edited").exists()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"arg__labels": "[" * 100_000 + "]" * 100_000}, "arg__labels"),
        ({"extra": '{"a":' * 100_000 + "1" + "}" * 100_000}, "extra"),
        ({"arg__labels": "[" * 1_000 + "]" * 1_000}, "arg__labels"),
    ],
    ids=["list", "extra-object", "within-the-parsers-limit"],
)
def test_edit_post_nested_too_deeply_is_a_form_error(client, scaler, changes, field):
    ticket, approver = scaler
    client.force_login(approver)

    response = client.post(edit_url(ticket), scale_form(**changes))

    assert response.status_code == 400
    page = response.content.decode()
    assert f'id="{field}-error">This value is nested too deeply' in page
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert not PreAuthorization.objects.exists()


def test_edit_post_with_nothing_changed_says_to_approve_instead(client, scaler):
    ticket, approver = scaler
    client.force_login(approver)

    response = client.post(edit_url(ticket), scale_form())

    assert response.status_code == 400
    assert "approve the call instead" in response.content.decode()
    assert not PreAuthorization.objects.exists()


def test_edit_by_the_requester_is_refused(client, setup):
    tenant, _, _ = setup
    requester = member(tenant, Role.ADMIN, username="admin-requester")
    ticket = Ticket.objects.get(run=paused_run(tenant, requested_by=requester))
    client.force_login(requester)

    page = client.get(edit_url(ticket))
    posted = client.post(
        edit_url(ticket), {"arg__release": "2026.07.25", "arg__environment": "production"}
    )

    assert page.status_code == posted.status_code == 403
    assert "someone else must approve it" in posted.content.decode()
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert not PreAuthorization.objects.exists()


def test_edit_by_a_viewer_is_refused(client, setup):
    tenant, ticket, _ = setup
    client.force_login(member(tenant, Role.VIEWER))

    assert client.get(edit_url(ticket)).status_code == 403
    assert client.post(edit_url(ticket), {"arg__release": "x"}).status_code == 403
    assert not PreAuthorization.objects.exists()


def test_edit_by_another_tenant_is_404(client, setup):
    _, ticket, _ = setup
    client.force_login(member(TenantFactory(), Role.ADMIN))

    assert client.get(edit_url(ticket)).status_code == 404
    response = client.post(
        edit_url(ticket), {"arg__release": "2026.07.25", "arg__environment": "production"}
    )
    assert response.status_code == 404
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


def test_edit_of_a_decided_ticket_is_409(client, setup):
    tenant, ticket, approver = setup
    decide(ticket, user=member(tenant, Role.ADMIN, username="boss"), approve=False)
    client.force_login(approver)

    response = client.post(
        edit_url(ticket), {"arg__release": "2026.07.25", "arg__environment": "production"}
    )

    assert response.status_code == 409
    assert "Already rejected by boss at " in response.content.decode()


@RESUMES
def test_the_diff_is_shown_wherever_the_decision_appears(client):
    tenant = TenantFactory()
    approver = member(tenant, Role.ADMIN, username="approver")
    ticket = Ticket.objects.get(run=paused_run(tenant, requested_by=member(tenant, Role.VIEWER)))
    client.force_login(approver)
    client.post(
        edit_url(ticket),
        {"arg__release": "2026.07.25", "arg__environment": "production", "message": "Use .25"},
    )
    resume(run_id=ticket.run_id, worker_id="w1")
    new = Ticket.objects.get(run_id=ticket.run_id, generation=2)
    diff = "<del>&quot;2026.07.24&quot;</del> → <ins>&quot;2026.07.25&quot;</ins>"

    original_page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    new_page = client.get(reverse("approvals:ticket", args=[new.pk])).content.decode()
    run_page = client.get(reverse("approvals:run", args=[ticket.run_id])).content.decode()
    audit_page = client.get(reverse("approvals:audit")).content.decode()

    assert "Edited by approver:" in original_page
    assert f"ticket #{new.pk}</a> was approved by the pre-authorisation" in original_page
    assert diff in original_page
    assert "Pre-authorised by approver:</strong> edited from" in new_page
    assert f">ticket #{ticket.pk}</a>" in new_page
    assert diff in new_page
    assert run_page.count(diff) == 2
    assert "Edited: rejected with corrected arguments" in run_page
    assert "Approved: pre-authorised edit" in run_page
    assert "Pre-authorised by approver: edited from <a href" in run_page
    assert audit_page.count(diff) == 2
    assert (
        "approved by the pre-authorisation <strong>approver</strong> made when editing ticket "
        f"#<strong>{ticket.pk}</strong>."
    ) in audit_page


@pytest.mark.slow
@RESUMES
def test_edit_and_approve_through_the_worker_process_runs_the_edited_release(manage_process):
    """As with `make run`: the worker resumes, the new call is pre-authorised and queued, and
    the same worker batch resumes again and deploys the edited release once."""
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER, username="rm-alice")
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER))
    ticket = Ticket.objects.get(run=run)
    edit_and_approve(ticket, user=approver, arguments=EDITED)

    worker = manage_process("db_worker", "--batch", "--no-startup-delay")
    _, err = worker.communicate(timeout=120)

    assert worker.returncode == 0, err
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert [(e["release"], e["environment"]) for e in demo.read_effects("deploy_release")] == [
        ("2026.07.25", "production")
    ]
    assert AuditEvent.objects.get(action="ticket.preauthorised").actor_name == "rm-alice"
    assert DBTaskResult.objects.filter(status="SUCCESSFUL").count() == 2


def test_the_original_ticket_says_whether_its_pre_authorisation_was_used(client, setup):
    _, ticket, approver = setup
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    client.force_login(approver)
    url = reverse("approvals:ticket", args=[ticket.pk])

    waiting = client.get(url).content.decode()
    PreAuthorization.objects.filter(pk=pre.pk).update(expires_at=pre.created_at)
    expired = client.get(url).content.decode()

    assert "Not used yet: the agent has not called again" in waiting
    assert "The pre-authorisation expired unused." in expired
    assert "edit-and-approve" not in waiting


# --- under a policy ---------------------------------------------------------------------------


@RESUMES
def test_preauthorisation_is_one_vote_under_a_quorum_of_two(setup, model_calls):
    tenant, ticket, approver = setup
    admin = member(tenant, Role.ADMIN, username="admin")
    second = member(tenant, Role.APPROVER, username="second")
    save_policy(tenant=tenant, user=admin, tool_name="deploy_release", required_approvals=2)
    ticket.refresh_from_db()
    edit_and_approve(ticket, user=approver, arguments=EDITED)

    resume(run_id=ticket.run_id, worker_id="w1")

    # The model called again with the edited arguments: the editor's approval counts once, the
    # policy wants a second person, so the ticket waits and the run stays paused.
    run = Run.objects.get(pk=ticket.run_id)
    new = Ticket.objects.get(run=run, generation=2)
    assert (run.status, new.status) == (RunStatus.PAUSED, TicketStatus.PENDING)
    assert list(new.votes.values_list("user__username", flat=True)) == ["approver"]
    # A vote, named as coming from the pre-authorisation; not an approval.
    assert not AuditEvent.objects.filter(action="ticket.preauthorised").exists()
    event = AuditEvent.objects.get(action="ticket.vote", ticket_id=new.pk)
    assert (event.actor_name, event.outcome) == ("approver", "pending")
    assert event.detail["preauthorised_by"] == "approver"
    assert event.detail["original_ticket"] == ticket.pk
    assert event.detail["progress"].startswith("1 of 2 approvals")
    assert PreAuthorization.objects.get(original_ticket=ticket).used_by == new
    # The page of the waiting ticket says where it came from, with the diff.
    from django.test import Client

    viewer = Client()
    viewer.force_login(second)
    page = viewer.get(reverse("approvals:ticket", args=[new.pk])).content.decode()
    assert "Pre-authorised by approver:" in page
    assert f'edited from <a href="/tickets/{ticket.pk}/">ticket #{ticket.pk}</a>' in page
    assert "2026.07.25" in page and "1 of 2 approvals: approver" in page
    timeline = viewer.get(reverse("approvals:run", args=[run.pk])).content.decode()
    assert "Approval counted towards the quorum" in timeline
    assert f'Pre-authorised by approver: edited from <a href="/tickets/{ticket.pk}/">' in timeline

    # The editor cannot add a second vote; another approver completes the quorum.
    with pytest.raises(AlreadyVotedError):
        decide(new, user=approver, approve=True)
    decide(new, user=second, approve=True)

    new.refresh_from_db()
    run.refresh_from_db()
    assert (new.status, new.decided_by, run.status) == (
        TicketStatus.APPROVED,
        second,
        RunStatus.QUEUED,
    )
    final = resume(run_id=run.pk, worker_id="w2")
    assert final.status == RunStatus.COMPLETED
    assert [e["release"] for e in demo.read_effects("deploy_release")] == ["2026.07.25"]


def test_edit_is_refused_to_an_approver_outside_the_policys_groups(setup):
    tenant, ticket, approver = setup
    admin = member(tenant, Role.ADMIN, username="admin")
    save_group(tenant=tenant, user=admin, name="release managers", members=[admin])
    save_policy(
        tenant=tenant,
        user=admin,
        tool_name="deploy_release",
        required_approvals=1,
        allowed_groups=["release managers"],
    )
    ticket.refresh_from_db()

    with pytest.raises(NotAllowedError, match="release managers"):
        edit_and_approve(ticket, user=approver, arguments=EDITED)

    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert not PreAuthorization.objects.exists()


# --- a run this console cannot resume ---------------------------------------------------------


def test_edit_of_a_run_whose_agent_version_is_gone_says_reject_or_deploy(client, setup):
    _, ticket, approver = setup
    Run.objects.filter(pk=ticket.run_id).update(agent_version="9")
    ticket.refresh_from_db()
    client.force_login(approver)

    response = client.get(edit_url(ticket))

    page = response.content.decode()
    assert response.status_code == 409
    assert (
        "This run cannot resume here: agent &#x27;release&#x27; version &#x27;9&#x27; is not "
        "deployed (deployed: 1). Reject the call with a message to the agent, or ask an admin "
        "to deploy agent release v9."
    ) in page
    assert "approve or reject the call as it is" not in page
    assert 'id="edit-form"' not in page
    with pytest.raises(ToolUnavailableError):
        edit_and_approve(ticket, user=approver, arguments=EDITED)
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


@RESUMES
def test_the_run_page_says_what_was_requested_and_what_was_approved_as_edited(client):
    tenant = TenantFactory()
    approver = member(tenant, Role.APPROVER, username="approver")
    run = paused_run(
        tenant,
        requested_by=member(tenant, Role.VIEWER),
        prompt="Deploy release 2026.07.24 to staging",
    )
    ticket = Ticket.objects.get(run=run)
    edit_and_approve(
        ticket, user=approver, arguments={"environment": "staging", "release": "2026.07.25"}
    )
    resume(run_id=run.pk, worker_id="w1")  # the model calls again; the edit pre-authorises it
    resume(run_id=run.pk, worker_id="w2")
    client.force_login(approver)

    page = client.get(reverse("approvals:run", args=[run.pk])).content.decode()

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.final_output == "Release 2026.07.25: Release 2026.07.25 is live on staging."
    # The title names what ran; what was asked stays on the page beside it.
    assert run.title == "Deploy release 2026.07.25 to staging"
    assert (
        '<span id="run-title">“Deploy release 2026.07.25 to staging” <span class="muted" '
        'id="run-requested">(requested as “Deploy release 2026.07.24 to staging”)</span></span>'
    ) in page
    assert (
        f'<p class="run-edited" id="run-edited-{ticket.pk}"><strong>Approved as edited</strong> by '
        f'approver (<a href="/tickets/{ticket.pk}/">ticket #{ticket.pk}</a>, '
        '<span class="tool">deploy_release</span>): <span class="edit-change"><code>release</code> '
        "edited from <del>&quot;2026.07.24&quot;</del> to <ins>&quot;2026.07.25&quot;</ins></span>."
    ) in page
