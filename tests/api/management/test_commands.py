from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from api import tokens
from api.models import ApiToken
from approvals.models import AuditEvent, Role
from tests.support import TenantFactory, api_token, member


@pytest.fixture
def tenant(db):
    tenant = TenantFactory(slug="acme")
    member(tenant, Role.APPROVER, username="alice")
    member(tenant, Role.VIEWER, username="vic")
    return tenant


def run(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_create_token_prints_the_token_once(tenant):
    out, err = run(
        "create_token",
        "acme",
        "deploy bot",
        "--scope",
        "tickets:decide",
        "--scope",
        "runs:read",
        "--user",
        "alice",
        "--days",
        "7",
    )

    token = out.strip()
    row = ApiToken.objects.get()
    assert out.count("\n") == 1
    assert tokens.authenticate(f"Bearer {token}") == row
    assert (row.scopes, row.user.username, (row.expires_at - row.created_at).days) == (
        ["runs:read", "tickets:decide"],
        "alice",
        7,
    )
    assert err.startswith(f"token {row.prefix} (deploy bot) for acme")
    assert token not in err
    assert AuditEvent.objects.get(action="token.created").detail["via"] == "command"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nowhere", "x", "--scope", "runs:read"], "no tenant 'nowhere'"),
        (["acme", "x", "--scope", "runs:read", "--user", "nobody"], "no user named 'nobody'"),
        (["acme", "x"], "Choose at least one scope."),
        (["acme", "x", "--scope", "runs:all"], "Unknown scope runs:all; the scopes are "),
        (["acme", "x", "--scope", "runs:read", "--days", "500"], "A token lasts 1 to 365 days"),
        (
            ["acme", "x", "--scope", "tickets:decide", "--user", "vic"],
            "A token acting as vic cannot have tickets:decide",
        ),
    ],
)
def test_create_token_refuses_bad_input_in_one_line(tenant, args, message):
    with pytest.raises(CommandError) as refused:
        run("create_token", *args)

    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)
    assert ApiToken.objects.count() == 0


def test_list_and_revoke_tokens(tenant):
    row, _ = api_token(tenant, "runs:read")

    listed, _ = run("list_tokens", "--tenant", "acme")
    assert listed.split("\t")[:4] == [row.prefix, "acme", "test", "runs:read"]
    assert listed.strip().endswith("active")

    out, _ = run("revoke_token", row.prefix)
    assert out == f"token {row.prefix} (test) revoked\n"
    assert run("list_tokens")[0].strip().endswith("revoked")
    with pytest.raises(CommandError) as again:
        run("revoke_token", row.prefix)
    assert str(again.value).startswith(f"Token {row.prefix} was already revoked on ")
    assert str(again.value).endswith(" by a command.")
    with pytest.raises(CommandError, match="^no API token with prefix 'zzzzzzzz'$"):
        run("revoke_token", "zzzzzzzz")
    with pytest.raises(CommandError, match="^no tenant 'globex'$"):
        run("list_tokens", "--tenant", "globex")


@pytest.mark.django_db(transaction=True)
def test_bad_input_exits_non_zero_with_one_line(manage_process):
    process = manage_process("create_token", "nowhere", "x", "--scope", "runs:read")
    out, err = process.communicate(timeout=120)

    assert process.returncode == 1
    assert out == ""
    assert err.strip().splitlines() == ["CommandError: no tenant 'nowhere'"]
