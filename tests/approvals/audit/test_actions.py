"""One vocabulary of audit actions: every action the code appends is in the table, with a label,
a live hint kind and (where it notifies) its notification event; an unknown one is refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import transaction

from approvals.audit import actions, chain
from approvals.models import AuditEvent
from tests.support import TenantFactory

ROOT = Path(__file__).resolve().parents[3]


def _appended_actions() -> dict[str, str]:
    """Every literal action="..." the product code passes, with where it is."""
    found = {}
    for app in ("approvals", "notifications", "sessions_admin"):
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                for keyword in node.keywords:
                    if keyword.arg != "action":
                        continue
                    # A literal, or either branch of a conditional: never built from pieces.
                    values = [keyword.value]
                    if isinstance(keyword.value, ast.IfExp):
                        values = [keyword.value.body, keyword.value.orelse]
                    for value in values:
                        # An action built from pieces could not be checked against the table.
                        assert not isinstance(value, ast.JoinedStr), ast.unparse(value)
                        # (argparse's action="store_true" has no dot, an audit action one)
                        if isinstance(value, ast.Constant) and "." in str(value.value):
                            found[value.value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_every_appended_action_is_in_the_table():
    appended = _appended_actions()

    assert len(appended) > 30
    assert {a: where for a, where in appended.items() if a not in actions.ACTIONS} == {}


def test_every_notification_event_of_the_table_is_one_notifications_send():
    from notifications.models import Event

    notify = {a.notify for a in actions.ACTIONS.values() if a.notify}

    assert notify == set(Event.values)


def test_every_action_has_a_label_and_a_live_kind():
    assert all(a.label and a.live for a in actions.ACTIONS.values())
    assert actions.label("ticket.approved") == "Approved"
    # An event of an older version reads as it was written.
    assert actions.label("ticket.teleported") == "ticket.teleported"


@pytest.mark.django_db
def test_append_refuses_an_action_missing_from_the_table():
    tenant = TenantFactory()

    with pytest.raises(actions.UnknownActionError), transaction.atomic():
        chain.append(tenant_id=tenant.pk, action="ticket.teleported")

    assert AuditEvent.objects.count() == 0
