"""What you see is what runs: one canonical reading of a call. Each test is a reproduction
that passed on the old code (the wrong call was shown, approvable or auto-approved)."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from approvals.audit import actions
from approvals.core import presenters, reading
from approvals.decisions import batch, calls
from approvals.decisions.decide import decide
from approvals.decisions.errors import DigestMismatchError, FlaggedCallError
from approvals.models import AuditEvent, Role, Run, RunStatus, Ticket, TicketStatus
from approvals.policies import rules
from approvals.policies.versions import save_policy
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_call

pytestmark = pytest.mark.django_db

STAGING_LOOKING = {
    " environment": "staging",
    "description": "routine staging refresh " + "x" * 60,
    "environment": "production",
    "release": "2026.12.24",
}


@pytest.fixture
def tenant():
    return TenantFactory(slug="acme")


@pytest.fixture
def approver(tenant):
    return member(tenant, Role.APPROVER, username="rm")


def only_ticket(run: Run) -> Ticket:
    return Ticket.objects.get(run=run)


# --- malformed calls ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (STAGING_LOOKING, 'the tool takes no argument called [" environment"]'),
        (
            '{"environment":"staging","environment":"production","release":"2026.12.24"}',
            "repeated keys",
        ),
        ({"environment": "production", "release": 20261224}, "release: must be text"),
        ({"environment": "production", "release": "1", "force": True}, "called force"),
        ("deploy everything", "not JSON at all"),
    ],
    ids=["hidden-space-key", "duplicate-keys", "wrong-type", "unknown-key", "not-json"],
)
def test_a_malformed_call_is_rejected_to_the_model_and_never_approvable(
    tenant, approver, arguments, reason
):
    run = paused_call(tenant, arguments)
    ticket = only_ticket(run)

    assert ticket.status == TicketStatus.REJECTED
    assert ticket.decision_source == "malformed"
    assert reason in ticket.decision_message
    assert ticket.decision_message.endswith(
        "Call deploy_release again with arguments that fit its schema."
    )
    event = AuditEvent.objects.get(ticket=ticket, action="ticket.malformed")
    assert event.outcome == TicketStatus.REJECTED
    # Nothing was pending, so the run goes on: the model reads the reasons; nothing deployed.
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert resume(run_id=run.pk).status == RunStatus.COMPLETED
    assert demo.read_effects("deploy_release") == []


def test_arguments_nested_deeper_than_a_parser_goes_are_malformed_not_a_crash():
    raw = '{"environment": ' + "[" * 100_000 + "]" * 100_000 + "}"

    (reason,) = calls.malformed_reasons(raw, None)

    assert "not JSON at all" in reason


def test_a_malformed_call_shows_as_such_on_its_page(client, tenant, approver):
    ticket = only_ticket(paused_call(tenant, STAGING_LOOKING))
    client.force_login(approver)

    body = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    assert "Malformed call: not approvable." in body
    assert "⟨U+0020⟩" not in body or "[&quot; environment&quot;]" in body
    assert 'value="approve"' not in body


def test_the_demo_release_call_is_well_formed(tenant):
    ticket = only_ticket(paused_call(tenant, {"environment": "staging", "release": "2026.12.24"}))

    assert ticket.status == TicketStatus.PENDING


# --- invisible and look-alike characters ------------------------------------------------------


@pytest.mark.parametrize(
    ("environment", "kind", "shown"),
    [
        ("\u202egnigats", "invisible", "⟨U+202E⟩gnigats"),
        ("prod\u200buction", "invisible", "prod⟨U+200B⟩uction"),
        ("pr\u043eduction", "lookalike", "prоduction"),
        ("\u0440\u0430\u0443", "lookalike", "рау"),
    ],
    ids=["bidi-override", "zero-width", "cyrillic-o", "whole-script"],
)
def test_a_flagged_call_is_shown_escaped_and_approvable_only_on_its_page(
    client, tenant, approver, environment, kind, shown
):
    ticket = only_ticket(paused_call(tenant, {"environment": environment, "release": "1"}))
    assert ticket.status == TicketStatus.PENDING
    assert [f.kind for f in calls.read(ticket.arguments_json).flags] == [kind]

    # Not in a batch, whatever the queue offered.
    (outcome,) = batch.decide_batch([ticket.pk], user=approver, approve=True)
    assert (outcome.done, outcome.result.startswith("This call holds invisible")) == (False, True)
    # Not by a decision that did not show the flags.
    with pytest.raises(FlaggedCallError) as refused:
        decide(ticket, user=approver, approve=True)
    assert str(refused.value) == (
        "this call holds invisible characters or look-alike letters; approve it from its own "
        "ticket page, where they are shown"
    )

    client.force_login(approver)
    body = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    assert "Look closely: this call is flagged." in body
    assert f"&quot;{shown}&quot;" in body
    queue = client.get(reverse("approvals:queue")).content.decode()
    assert "flagged: approve on its page" in queue
    assert f'name="ticket" value="{ticket.pk}"' not in queue

    # The page shows the flags and says so when it posts the approval.
    response = client.post(
        reverse("approvals:decide", args=[ticket.pk]), {"decision": "approve", "flags_seen": "on"}
    )
    assert response.status_code == 302
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.APPROVED


def test_escape_makes_every_invisible_character_visible():
    text = "a\u202eb\u200bc\u00a0d\u2066e\u0000f\u3164g"

    assert reading.escape(text) == ("a⟨U+202E⟩b⟨U+200B⟩c⟨U+00A0⟩d⟨U+2066⟩e⟨U+0000⟩f⟨U+3164⟩g")
    assert reading.escape("plain text, with spaces\nand a line") == (
        "plain text, with spaces\nand a line"
    )


def test_plain_words_of_one_script_are_not_flagged():
    assert reading.flags_of({"environment": "production", "note": "привет, déjà vu"}) == []


# --- types and structure ----------------------------------------------------------------------


def test_the_diff_sees_types_and_structure():
    before = {"x": {"y": "1"}, "flag": "true", "empty": []}
    after = {"x.y": 1, "flag": True, "empty": "[]"}

    changes = {(c.path, c.kind, c.before, c.after) for c in presenters.diff(before, after)}

    assert changes == {
        ("x.y", "removed", '"1"', ""),
        ('["x.y"]', "added", "", "1"),
        ("flag", "changed", '"true"', "true"),
        ("empty", "changed", "[]", '"[]"'),
    }


def test_the_table_shows_each_value_with_its_type():
    rows = presenters.argument_rows({"n": 1, "s": "1", "b": True, "z": None, "l": []})

    assert [(r.path, r.value, r.kind) for r in rows] == [
        ("n", "1", "number"),
        ("s", '"1"', "text"),
        ("b", "true", "boolean"),
        ("z", "null", "null"),
        ("l", "[]", "list"),
    ]


def test_a_long_value_says_how_much_more_there_is_and_keeps_it_whole():
    value = "staging" + " " * 170 + "; production"

    (row,) = presenters.argument_rows({"environment": value})
    line = presenters.summary(json.dumps({"environment": value}))

    assert row.value == json.dumps(value)
    assert row.more == len(row.value) - presenters.FOLD_AT
    assert line.endswith(f" … {len(json.dumps(value)) + 12 - 90} more characters")


# --- automatic rules ------------------------------------------------------------------------


@pytest.mark.parametrize("environment", ["Production", "PRODUCTION", "ｐｒｏｄｕｃｔｉｏｎ"])
def test_a_not_equal_rule_compares_the_normalised_value(tenant, environment):
    admin = member(tenant, Role.ADMIN)
    save_policy(
        tenant=tenant,
        user=admin,
        tool_name="deploy_release",
        auto_rules=rules.parse_auto_rules(
            "approve if environment != production because staging is low risk"
        ),
    )

    ticket = only_ticket(paused_call(tenant, {"environment": environment, "release": "1"}))

    assert ticket.status == TicketStatus.PENDING


def test_a_rule_never_auto_approves_a_flagged_call(tenant):
    admin = member(tenant, Role.ADMIN)
    save_policy(
        tenant=tenant,
        user=admin,
        tool_name="deploy_release",
        auto_rules=rules.parse_auto_rules(
            "approve if environment != production because staging is low risk"
        ),
    )

    ticket = only_ticket(paused_call(tenant, {"environment": "production\u200b", "release": "1"}))

    assert ticket.status == TicketStatus.PENDING


def test_rule_patterns_run_on_re2():
    rule = {"argument": "x", "op": "matches", "value": "(a+)+$", "decision": "approve"}

    assert rules.rule_matches(rule, {"x": "a" * 28 + "!"}) is False
    assert rules.rule_matches(rule, {"x": "aaaa"}) is True
    with pytest.raises(rules.RuleSyntaxError, match="RE2"):
        rules.parse_auto_rules("approve if x matches (?=a)a because look-ahead")


# --- the table is bound to the digest ---------------------------------------------------------


def test_a_changed_copy_of_the_arguments_is_an_integrity_error(client, tenant, approver):
    ticket = only_ticket(paused_call(tenant, {"environment": "production", "release": "1"}))
    Ticket.objects.filter(pk=ticket.pk).update(
        arguments_json='{"environment":"staging","release":"1"}'
    )
    ticket.refresh_from_db()
    client.force_login(approver)

    body = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    queue = client.get(reverse("approvals:queue")).content.decode()

    assert "Integrity error: not approvable." in body
    # The table shows the call the state holds: what would run.
    assert "&quot;production&quot;" in body
    assert 'value="approve"' not in body
    assert "integrity error" in queue
    with pytest.raises(DigestMismatchError, match="copy of the arguments differs"):
        decide(ticket, user=approver, approve=True)


def test_a_ticket_whose_tool_differs_from_the_state_is_not_approvable(tenant, approver):
    ticket = only_ticket(paused_call(tenant, {"environment": "staging", "release": "1"}))
    Ticket.objects.filter(pk=ticket.pk).update(tool_name="publish_invoice")
    ticket.refresh_from_db()

    with pytest.raises(DigestMismatchError, match="not publish_invoice"):
        decide(ticket, user=approver, approve=True)


def test_a_ticket_that_is_not_approvable_can_still_be_rejected(tenant, approver):
    """The digest gate guards approvals: refusing the call is always possible."""
    ticket = only_ticket(paused_call(tenant, {"environment": "staging", "release": "1"}))
    Ticket.objects.filter(pk=ticket.pk).update(tool_name="publish_invoice")
    ticket.refresh_from_db()

    rejected = decide(ticket, user=approver, approve=False, message="this is not the call")

    assert (rejected.status, rejected.decision_message) == (
        TicketStatus.REJECTED,
        "this is not the call",
    )


# --- the conversation -------------------------------------------------------------------------


def test_a_secret_in_the_prompt_is_masked_in_the_conversation(client, tenant, approver):
    secret = "sk-live-" + "a1B2c3D4" * 5
    ticket = only_ticket(paused_call(tenant, {"environment": "staging", "release": "1"}))
    run = ticket.run
    client.force_login(approver)

    body = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    assert secret not in body  # the scripted prompt holds none: the masking is checked below
    masked = presenters.transcript({"original_input": f"deploy with {secret}"})
    assert masked[0].text == "deploy with [redacted]"
    assert run.pk


def test_ticket_malformed_is_one_of_the_audit_actions():
    assert actions.label("ticket.malformed") == "Rejected: the call does not fit its tool"


def test_a_schemas_validator_is_built_once_and_kept_with_that_schema(monkeypatch):
    built = []
    original = calls.validator_for

    def validator_for(schema, default):
        built.append(schema)
        return original(schema, default=default)

    monkeypatch.setattr(calls, "validator_for", validator_for)
    monkeypatch.setattr(calls, "_validators", {})
    schema = {
        "type": "object",
        "properties": {"release": {"type": "string"}},
        "required": ["release"],
        "additionalProperties": False,
    }
    assert calls.schema_problems(schema, {"release": "v1"}) == []
    assert [p.argument for p in calls.schema_problems(schema, {"release": 5})] == ["release"]
    assert len(built) == 1
    # Another schema object, even an equal one, has a validator of its own: a schema is known
    # by the object itself, so a changed copy is never checked by another's validator.
    other = {**schema, "properties": {"release": {"type": "integer"}}}
    assert calls.schema_problems(other, {"release": 5}) == []
    assert [p.argument for p in calls.schema_problems(schema, {"release": 5})] == ["release"]
    assert len(built) == 2
