from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from api import tokens
from api.models import ApiToken
from approvals.models import AuditEvent, Membership, Role
from tests.support import TenantFactory, api_token, member


@pytest.fixture
def tenant(db):
    return TenantFactory(slug="acme")


def test_issue_stores_the_hash_and_prefix_never_the_token(tenant):
    admin = member(tenant, Role.ADMIN)
    issued = tokens.issue(tenant=tenant, name="pipeline", scopes=["runs:read"], created_by=admin)

    text = issued.secret
    assert tokens.TOKEN_PATTERN.fullmatch(text)
    row = ApiToken.objects.get()
    assert text.startswith(f"apc_{row.prefix}_")
    assert len(row.prefix) == 8
    assert row.token_hash == hashlib.sha256(text.encode()).hexdigest()
    assert text not in repr(list(ApiToken.objects.values()))
    assert row.expires_at - row.created_at == timedelta(days=90)
    event = AuditEvent.objects.get(action="token.created")
    assert event.actor_id == admin.pk
    assert event.detail["prefix"] == row.prefix
    assert event.detail["scopes"] == ["runs:read"]
    assert text not in str(event.detail)


@pytest.mark.parametrize(
    ("kwargs", "field", "sentence"),
    [
        ({"name": " "}, "name", "Give the token a name."),
        ({"scopes": []}, "scopes", "Choose at least one scope."),
        ({"scopes": ["runs:delete"]}, "scopes", "Unknown scope runs:delete; the scopes are "),
        ({"days": 0}, "days", "A token lasts 1 to 365 days, not 0."),
        ({"days": 366}, "days", "A token lasts 1 to 365 days, not 366."),
        (
            {"scopes": ["tickets:decide"]},
            "user",
            "A token with tickets:decide acts as a person: choose who.",
        ),
    ],
)
def test_issue_refuses_bad_requests_writing_nothing(tenant, kwargs, field, sentence):
    values = {"tenant": tenant, "name": "ci", "scopes": ["runs:read"], **kwargs}
    with pytest.raises(tokens.TokenRequestError) as refused:
        tokens.issue(**values)
    assert refused.value.field == field
    assert refused.value.sentence().startswith(sentence)
    assert ApiToken.objects.count() == 0
    assert AuditEvent.objects.filter(action="token.created").count() == 0


def test_issue_refuses_decide_for_a_person_who_cannot_decide(tenant):
    viewer = member(tenant, Role.VIEWER, username="vera")
    outsider = member(TenantFactory(slug="globex"), Role.APPROVER, username="olga")

    with pytest.raises(tokens.TokenRequestError) as refused:
        tokens.issue(tenant=tenant, name="ci", scopes=["tickets:decide"], user=viewer)
    assert refused.value.sentence() == (
        "A token acting as vera cannot have tickets:decide: they are a viewer of acme, who "
        "cannot decide tickets."
    )
    with pytest.raises(tokens.TokenRequestError) as refused:
        tokens.issue(tenant=tenant, name="ci", scopes=["runs:read"], user=outsider)
    assert refused.value.sentence() == (
        "A token of acme cannot act as olga, who is not an active member of it."
    )
    assert ApiToken.objects.count() == 0


def test_authenticate_says_why_a_token_is_refused(tenant):
    admin = member(tenant, Role.ADMIN, username="ada")
    row, text = api_token(tenant, "runs:read")

    def refusal(header):
        with pytest.raises(tokens.TokenRefusedError) as refused:
            tokens.authenticate(header)
        return refused.value.code, refused.value.sentence()

    missing = "Send an API token in the header Authorization: Bearer apc_<prefix>_<secret>."
    assert refusal(None) == ("token_missing", missing)
    assert refusal(f"Basic {text}") == ("token_missing", missing)
    assert refusal("Bearer apc_short") == (
        "token_malformed",
        "That is not an API token: they read apc_<8 letters or digits>_<43 characters>.",
    )
    forged = text[:-4] + ("AAAA" if not text.endswith("AAAA") else "BBBB")
    assert refusal(f"Bearer {forged}") == ("token_unknown", "This API token is not known.")
    assert tokens.authenticate(f"Bearer {text}") == row
    assert tokens.authenticate(f"bearer  {text} ") == row

    ApiToken.objects.filter(pk=row.pk).update(expires_at=datetime(2026, 1, 2, 3, 4, tzinfo=UTC))
    assert refusal(f"Bearer {text}") == (
        "token_expired",
        "This API token expired on 2026-01-02 03:04 UTC.",
    )
    tokens.revoke(row, by=admin)
    code, sentence = refusal(f"Bearer {text}")
    assert code == "token_revoked"
    assert sentence == f"This API token was revoked on {row.revoked_at:%Y-%m-%d %H:%M} UTC by ada."


def test_a_token_of_a_person_who_left_is_refused(tenant):
    person = member(tenant, Role.APPROVER, username="paul")
    _, text = api_token(tenant, "tickets:decide", user=person)
    Membership.objects.filter(user=person).delete()

    with pytest.raises(tokens.TokenRefusedError) as refused:
        tokens.authenticate(f"Bearer {text}")
    assert refused.value.code == "token_person_gone"
    assert refused.value.sentence() == (
        "This API token acts as paul, who is no longer an active member of acme."
    )


def test_a_token_of_a_deactivated_person_is_refused_though_still_a_member(tenant):
    person = member(tenant, Role.APPROVER, username="paul")
    _, text = api_token(tenant, "tickets:decide", user=person)
    type(person).objects.filter(pk=person.pk).update(is_active=False)

    with pytest.raises(tokens.TokenRefusedError) as refused:
        tokens.authenticate(f"Bearer {text}")
    assert refused.value.code == "token_person_gone"


def test_revoke_happens_once(tenant):
    admin = member(tenant, Role.ADMIN, username="ada")
    row, _ = api_token(tenant, "runs:read")

    tokens.revoke(row, by=admin)
    with pytest.raises(tokens.TokenAlreadyRevokedError) as refused:
        tokens.revoke(row, by=admin)

    assert refused.value.status == 409
    assert refused.value.sentence().startswith(f"Token {row.prefix} was already revoked on ")
    assert AuditEvent.objects.filter(action="token.revoked").count() == 1
    event = AuditEvent.objects.get(action="token.revoked")
    assert (event.actor_id, event.detail["prefix"]) == (admin.pk, row.prefix)


def test_throttle_counts_fixed_minutes_and_says_when_to_retry(tenant, settings):
    settings.APPROVALS_API_RATE_PER_MINUTE = 3
    row, _ = api_token(tenant, "runs:read")
    start = datetime(2026, 12, 1, 10, 0, 15, tzinfo=UTC)

    assert [tokens.throttle(row, now=start + timedelta(seconds=s)) for s in (0, 1, 2)] == [1, 2, 3]
    with pytest.raises(tokens.RateLimitedError) as refused:
        tokens.throttle(row, now=start + timedelta(seconds=5))
    assert refused.value.retry_after == 40
    assert refused.value.status == 429
    assert refused.value.sentence() == "Too many requests: try again in 40 seconds."
    # The next minute of the clock is a fresh window.
    assert tokens.throttle(row, now=start + timedelta(seconds=45)) == 1


def test_record_use_writes_once_a_minute_with_the_last_count(tenant):
    row, _ = api_token(tenant, "runs:read")
    first = datetime(2026, 12, 1, 10, 0, 5, tzinfo=UTC)
    for seconds in (0, 10, 20):
        tokens.throttle(row, now=first + timedelta(seconds=seconds))

    wrote = [
        tokens.record_use(row, method="GET", path="/api/v1/runs", now=first + timedelta(seconds=s))
        for s in (0, 10, 20)
    ]
    assert wrote == [True, False, False]
    row.refresh_from_db()
    assert row.last_used_at == first

    later = datetime(2026, 12, 1, 10, 3, 1, tzinfo=UTC)
    assert tokens.record_use(row, method="GET", path="/api/v1/tickets", now=later)

    events = list(AuditEvent.objects.filter(action="token.used").order_by("seq"))
    assert [e.detail for e in events] == [
        {
            "via": "api",
            "prefix": row.prefix,
            "window": "2026-12-01T10:00:00+00:00",
            "method": "GET",
            "path": "/api/v1/runs",
        },
        {
            "via": "api",
            "prefix": row.prefix,
            "window": "2026-12-01T10:03:00+00:00",
            "method": "GET",
            "path": "/api/v1/tickets",
            "previous_window": "2026-12-01T10:00:00+00:00",
            "previous_requests": 3,
        },
    ]
    assert events[0].actor_name == f"API token {row.prefix}"


def test_record_use_of_a_stale_row_writes_nothing_twice(tenant):
    row, _ = api_token(tenant, "runs:read")
    now = timezone.now()
    stale = ApiToken.objects.get(pk=row.pk)

    assert tokens.record_use(row, method="GET", path="/x", now=now)
    # Another request read the row before the first one wrote: the conditional UPDATE loses.
    assert not tokens.record_use(stale, method="GET", path="/x", now=now)
    assert AuditEvent.objects.filter(action="token.used").count() == 1
