"""An audit event read as a sentence: its action's template, what changed from what to what, the
rest of its detail as facts, and a generic sentence when the template cannot be filled."""

from __future__ import annotations

from approvals.audit import actions
from approvals.audit.sentences import ChangeLine, Description, Fact, Part, describe
from approvals.models import AuditEvent
from approvals.templatetags.approvals import said as said_html


def event(action: str, **fields) -> AuditEvent:
    return AuditEvent(action=action, **fields)


def test_sentences_policy_change_says_what_changed_from_what_to_what():
    changed = event(
        "policy.changed",
        actor_name="alice",
        detail={
            "scope": "deploy_release",
            "agent": "",
            "tool": "deploy_release",
            "version": 2,
            "changes": {"required_approvals": [1, 2], "allowed_groups": [[], ["release"]]},
            "tickets_moved": 0,
        },
    )

    said = describe(changed)

    assert said.sentence == "alice changed the policy for deploy_release to v2"
    assert said.changes == (
        ChangeLine("approvals needed", "changed", "1", "2"),
        ChangeLine("groups that may approve", "changed", "none", "release"),
    )
    assert said.text == (
        "alice changed the policy for deploy_release to v2: approvals needed 1 → 2; "
        "groups that may approve none → release."
    )
    assert said.facts == (Fact("tool", "deploy_release"), Fact("pending tickets moved", "0"))


def test_sentences_session_cleared_names_the_session_and_the_store():
    cleared = event(
        "session.cleared",
        actor_name="admin",
        detail={"store": "sqlite", "session_id": "acme-release-7", "items": 12},
    )

    assert describe(cleared).text == (
        "admin cleared session acme-release-7 in the sqlite store: 12 items."
    )


def test_sentences_one_item_is_singular():
    cleared = event("session.cleared", detail={"store": "redis", "session_id": "s", "items": 1})

    assert describe(cleared).text == "system cleared session s in the redis store: 1 item."


def test_sentences_name_the_ticket_and_the_tool():
    approved = event("ticket.approved", actor_name="bob", ticket_id=12, tool_name="deploy_release")

    said = describe(approved)

    assert said.parts == (
        Part("bob", is_value=True),
        Part(" approved "),
        Part("deploy_release", is_value=True),
        Part(" on "),
        Part("ticket #12", is_value=True),
    )


def test_sentences_opening_on_a_run_take_a_capital():
    assert describe(event("run.completed", run_id=3)).text == "Run #3 completed."


def test_sentences_fall_back_to_the_generic_one_when_a_field_is_missing():
    # session.cleared names a store; an event without one still reads, with what it has.
    odd = event("session.cleared", actor_name="admin", detail={"items": 3})

    said = describe(odd)

    assert said.text == "Session cleared by admin."
    assert said.facts == (Fact("items", "3"),)


def test_sentences_of_an_unknown_action_read_generically():
    said = describe(event("ticket.teleported", actor_name="eve", ticket_id=4, tool_name="beam"))

    assert said.text == "ticket.teleported by eve (beam, ticket #4)."


def test_sentences_keep_markup_as_text():
    # The page escapes each part; the sentence itself never turns a value into markup.
    comment = event(
        "ticket.commented",
        actor_name="<b>mallory</b>",
        ticket_id=5,
        detail={"text": "<script>alert(1)</script>"},
    )

    said = describe(comment)

    assert said.text == "<b>mallory</b> commented on ticket #5: “<script>alert(1)</script>”."
    assert all(
        isinstance(part.text, str) and not hasattr(part.text, "__html__") for part in said.parts
    )


def test_sentences_edit_changes_read_from_the_recorded_diff():
    edited = event(
        "ticket.edited",
        actor_name="carol",
        ticket_id=9,
        tool_name="deploy_release",
        detail={
            "edited_digest": "abc",
            "changes": [
                {"path": "release", "kind": "changed", "before": '"1"', "after": '"2"'},
                {"path": "note", "kind": "added", "before": "", "after": '"hotfix"'},
            ],
        },
    )

    said = describe(edited)

    assert [c.text for c in said.changes] == ['release "1" → "2"', 'note added: "hotfix"']
    assert said.facts == (Fact("digest of the edited arguments", "abc"),)


def test_sentences_every_action_of_the_table_has_a_sentence():
    assert [name for name, action in actions.ACTIONS.items() if not action.sentence] == []


def test_sentences_actions_group_by_area_with_readable_labels():
    groups = dict(actions.grouped())

    assert list(groups)[:5] == ["Tickets", "Runs", "Policies", "Members", "Sessions"]
    assert [a.label for a in groups["Sessions"]] == ["Session cleared"]
    assert {a.name for a in groups["Sign-in"]} >= {
        "auth.sign_in_failed",
        "auth.locked_out",
        "auth.signed_in",
        "auth.step_up",
        "mfa.enrolled",
        "mfa.recovery_code_used",
    }
    assert {a.name for a in groups["API"]} == {"token.created", "token.revoked", "token.used"}
    assert sum(len(group) for group in groups.values()) == len(actions.ACTIONS)


def test_sentences_member_changes_say_who_and_which_role():
    changed = event(
        "member.role_changed",
        actor_name="ada",
        detail={"user": "rita", "from": "viewer", "to": "approver", "via": "console"},
    )
    invited = event(
        "invitation.sent",
        actor_name="ada",
        detail={"email": "sam@example.com", "role": "auditor", "expires": "x", "via": "console"},
    )

    assert describe(changed).sentence == "ada changed the role of rita from viewer to approver"
    assert describe(invited).sentence == "ada invited sam@example.com as auditor"
    areas = {action.name: area for area, group in actions.grouped() for action in group}
    assert areas["tenant.created"] == areas["member.added"] == "Members"


def test_the_said_filter_shows_a_sentence_and_its_changes_with_every_value_escaped():
    hostile = "<img src=x onerror=\"alert(1)\"> & 'q'"
    said = Description(
        parts=(Part("alice changed "), Part(hostile, is_value=True), Part(" & more")),
        changes=(
            ChangeLine("approvals needed", "changed", "1", hostile),
            ChangeLine(hostile, "added", "", "release"),
            ChangeLine("groups", "removed", hostile, ""),
        ),
        facts=(),
    )
    escaped = "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; &#x27;q&#x27;"

    html = said_html(said)

    assert html == (
        f'<span class="sentence">alice changed <strong>{escaped}</strong> &amp; more.</span>'
        '<ul class="changes">'
        '<li class="change changed"><span class="what">approvals needed</span> '
        f"<del>1</del> → <ins>{escaped}</ins></li>"
        f'<li class="change added"><span class="what">{escaped}</span> added '
        "<ins>release</ins></li>"
        '<li class="change removed"><span class="what">groups</span> removed '
        f"<del>{escaped}</del></li>"
        "</ul>"
    )


def test_the_said_filter_leaves_out_the_list_when_nothing_changed():
    said = Description(
        parts=(Part("Run #3 "), Part("completed", is_value=True)), changes=(), facts=()
    )

    assert said_html(said) == '<span class="sentence">Run #3 <strong>completed</strong>.</span>'
