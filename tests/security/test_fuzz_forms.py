"""Any input to the filters and forms answers 2xx, 3xx or 4xx, never 500.

hypothesis.extra.django.TestCase wraps each example in its own transaction, so the data made
once in setUpTestData is shared, and what one example decides or purges is rolled back before
the next.
"""

from __future__ import annotations

import base64
import json
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path

from django.test import Client, override_settings
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase

from approvals.models import Role, Ticket
from sessions_admin.models import StoredItem, StoredSession
from tests.support import TenantFactory, member, paused_run

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
MD5 = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# A directory that does not exist: no SQLite session files, so a purge touches the ORM only.
NO_SQLITE_SESSIONS = Path(tempfile.gettempdir()) / "approvals-fuzz-no-sessions"
KNOWN = ["acme", "other", "release", "invoice", "deploy_release", "requester", "ticket.approved"]


def cursor(values: list) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


control = st.text(st.characters(min_codepoint=0, max_codepoint=0x1F), min_size=1, max_size=8)
long_text = st.builds(
    lambda piece, times: piece * times, st.text(min_size=1, max_size=4), st.integers(200, 3000)
)
dates = st.one_of(
    st.dates().map(date.isoformat),
    st.dates().map(lambda d: d.strftime("%m/%d/%Y")),
    st.sampled_from(["0001-01-01", "9999-12-31", "9999-12-30", "2026-02-30", "2026-13-01"]),
)
cursors = st.one_of(
    st.lists(st.integers() | st.floats() | st.text(max_size=10) | st.none(), max_size=3).map(
        cursor
    ),
    st.tuples(st.datetimes(timezones=st.just(UTC)), st.integers()).map(
        lambda pair: cursor([pair[0].isoformat(), pair[1]])
    ),
    st.tuples(st.datetimes(), st.integers()).map(
        lambda pair: cursor([pair[0].isoformat(), pair[1]])
    ),
    st.binary(max_size=40).map(lambda b: base64.urlsafe_b64encode(b).decode()),
)
anything = st.one_of(
    st.text(max_size=40),
    control,
    long_text,
    st.sampled_from(KNOWN),
    dates,
    st.datetimes().map(datetime.isoformat),
    st.integers().map(str),
    cursors,
    st.just(""),
)


def form(*names: str, **special) -> st.SearchStrategy[dict[str, str]]:
    """A dict of some of the fields, each any text (or a field's own strategy)."""
    fields = {name: special.get(name, anything) for name in names}
    return st.fixed_dictionaries({}, optional=fields)


class LenientClient(Client):
    """A 500 comes back as a response, so the assertion can name the input that caused it."""

    def __init__(self, **defaults) -> None:
        super().__init__(raise_request_exception=False, **defaults)


@override_settings(APPROVALS_SQLITE_SESSION_DIR=NO_SQLITE_SESSIONS, REDIS_URL="")
class FuzzFormsTests(TestCase):
    client_class = LenientClient

    @classmethod
    def setUpTestData(cls) -> None:
        with override_settings(PASSWORD_HASHERS=MD5):
            acme = TenantFactory(slug="acme")
            TenantFactory(slug="other")
            cls.requester = member(acme, Role.VIEWER, username="requester")
            cls.approver = member(acme, Role.APPROVER, username="fuzz-approver")
            cls.auditor = member(acme, Role.AUDITOR, username="fuzz-auditor")
            cls.admin = member(acme, Role.ADMIN, username="fuzz-admin")
        cls.ticket = Ticket.objects.get(run=paused_run(acme, requested_by=cls.requester))
        for session_id in ("acme-1", "acme-2", "test-3"):
            stored = StoredSession.objects.create(tenant=acme, session_id=session_id)
            StoredItem.objects.create(session=stored, data={"role": "user", "content": "hi"})

    def assert_no_server_error(self, response, data) -> None:
        if response.streaming:
            # An export fails while it streams, so read it to the end.
            b"".join(response.streaming_content)
        self.assertLess(response.status_code, 500, f"{response.status_code} for {data!r}")

    @FUZZ
    @given(data=form("tenant", "agent", "tool", "requester", "after"), htmx=st.booleans())
    def test_fuzz_queue_filters_never_500(self, data, htmx):
        self.client.force_login(self.approver)
        headers = {"HX-Request": "true", "HX-Target": "queue-rows"} if htmx else {}

        response = self.client.get(reverse("approvals:queue"), data, headers=headers)

        self.assert_no_server_error(response, data)

    @FUZZ
    @given(
        data=form(
            "tenant",
            "actor",
            "action",
            "tool",
            "outcome",
            "since",
            "until",
            "after",
            since=st.one_of(dates, anything),
            until=st.one_of(dates, anything),
        )
    )
    def test_fuzz_audit_filters_never_500(self, data):
        self.client.force_login(self.auditor)

        response = self.client.get(reverse("approvals:audit"), data)

        self.assert_no_server_error(response, data)

    @FUZZ
    @given(
        fmt=st.sampled_from(["csv", "jsonl"]),
        data=form(
            "tenant",
            "actor",
            "action",
            "tool",
            "outcome",
            "since",
            "until",
            since=st.one_of(dates, anything),
            until=st.one_of(dates, anything),
        ),
    )
    def test_fuzz_audit_export_filters_never_500(self, fmt, data):
        self.client.force_login(self.auditor)

        response = self.client.get(reverse("approvals:audit-export", args=[fmt]), data)

        self.assert_no_server_error(response, data)

    @FUZZ
    @given(
        page=st.sampled_from(["sessions_admin:list", "sessions_admin:purge"]),
        data=form(
            "backend",
            "tenant",
            "prefix",
            "older_than",
            backend=st.one_of(st.sampled_from(["django", "sqlite", "redis", "openai"]), anything),
            older_than=st.one_of(
                st.tuples(st.integers(-5, 10**7), st.sampled_from("mhdwy")).map(
                    lambda p: f"{p[0]}{p[1]}"
                ),
                st.sampled_from(["²d", "١٢d", " 7d ", "7D", "0d", "d"]),
                anything,
            ),
        ),
    )
    def test_fuzz_sessions_filters_never_500(self, page, data):
        self.client.force_login(self.admin)

        response = self.client.get(reverse(page), data)

        self.assert_no_server_error(response, data)

    @FUZZ
    @given(
        data=form(
            "backend",
            "tenant",
            "prefix",
            "older_than",
            "confirm",
            prefix=st.one_of(st.sampled_from(["acme", "test", "%", "_", "\\"]), anything),
            confirm=st.one_of(st.sampled_from(["0", "1", "2", "3", " 2 "]), anything),
        )
    )
    def test_fuzz_purge_confirm_never_500(self, data):
        self.client.force_login(self.admin)

        response = self.client.post(reverse("sessions_admin:purge-confirm"), data)

        self.assert_no_server_error(response, data)

    @FUZZ
    @given(
        data=form(
            "decision",
            "message",
            "always",
            decision=st.one_of(st.sampled_from(["approve", "reject", "APPROVE"]), anything),
            always=st.one_of(st.sampled_from(["on", "true", "false", "0"]), anything),
        ),
        user=st.sampled_from(["requester", "approver", "auditor", "admin"]),
        htmx=st.booleans(),
    )
    def test_fuzz_decide_form_never_500(self, data, user, htmx):
        self.client.force_login(getattr(self, user))
        headers = {"HX-Request": "true"} if htmx else {}

        response = self.client.post(
            reverse("approvals:decide", args=[self.ticket.pk]), data, headers=headers
        )

        self.assert_no_server_error(response, data)

    @FUZZ
    @given(
        data=form(
            "arg__release",
            "arg__environment",
            "extra",
            "message",
            extra=st.one_of(
                st.sampled_from(["{}", "[]", "null", '{"force": true}', '{"release": 1}', "{"]),
                anything,
            ),
        ),
        user=st.sampled_from(["requester", "approver", "auditor", "admin"]),
        method=st.sampled_from(["get", "post"]),
    )
    def test_fuzz_edit_form_never_500(self, data, user, method):
        self.client.force_login(getattr(self, user))

        response = getattr(self.client, method)(
            reverse("approvals:edit", args=[self.ticket.pk]), data
        )

        self.assert_no_server_error(response, data)

    @FUZZ
    @given(
        data=form(
            "action",
            "text",
            action=st.one_of(st.sampled_from(["claim", "take_over", "release", "CLAIM"]), anything),
        ),
        route=st.sampled_from(["approvals:claim", "approvals:comment"]),
        user=st.sampled_from(["requester", "approver", "auditor", "admin"]),
        htmx=st.booleans(),
    )
    def test_fuzz_claim_and_comment_forms_never_500(self, data, route, user, htmx):
        self.client.force_login(getattr(self, user))
        headers = {"HX-Request": "true"} if htmx else {}

        response = self.client.post(reverse(route, args=[self.ticket.pk]), data, headers=headers)

        self.assert_no_server_error(response, data)

    @FUZZ
    @given(
        tickets=st.lists(
            st.one_of(
                st.sampled_from(["1", "2", "999999", "0", "-1", "1.5", "１", "²", " 3 "]),
                st.integers(-(2**70), 2**70).map(str),
                anything,
            ),
            max_size=120,
        ),
        data=form(
            "decision",
            "message",
            decision=st.one_of(st.sampled_from(["approve", "reject"]), anything),
        ),
        user=st.sampled_from(["requester", "approver", "admin"]),
        htmx=st.booleans(),
    )
    @example(tickets=["9" * 30], data={"decision": "approve"}, user="admin", htmx=False)
    def test_fuzz_batch_form_never_500(self, tickets, data, user, htmx):
        self.client.force_login(getattr(self, user))
        headers = {"HX-Request": "true"} if htmx else {}

        response = self.client.post(
            reverse("approvals:batch"), {**data, "ticket": tickets}, headers=headers
        )

        self.assert_no_server_error(response, (tickets, data))

    @FUZZ
    @given(
        data=form(
            "tenant",
            "next",
            tenant=st.one_of(st.sampled_from(["acme", "other", ""]), anything),
            next=st.one_of(
                st.sampled_from(
                    [
                        "//evil.example/",
                        "https://evil.example/",
                        "/\\evil.example",
                        "\\\\evil.example",
                        "javascript:alert(1)",
                        "///evil.example",
                        "/audit/",
                        " //evil.example",
                        "\t//evil.example",
                    ]
                ),
                anything,
            ),
        )
    )
    # Found by this test: a "next" that is neither a path nor a URL is taken for a view name.
    @example(data={"next": "0"})
    def test_fuzz_tenant_switcher_never_500_nor_redirects_away(self, data):
        self.client.force_login(self.approver)

        response = self.client.post(reverse("approvals:switch-tenant"), data)

        self.assert_no_server_error(response, data)
        if response.status_code in (301, 302, 303, 307, 308):
            location = response["Location"]
            self.assertTrue(
                url_has_allowed_host_and_scheme(location, {"testserver"}),
                f"redirected off-site to {location!r} for {data!r}",
            )

    @FUZZ
    @given(
        name=st.sampled_from(["approvals:ticket", "approvals:run"]),
        pk=st.one_of(st.integers(0, 10**4), st.integers(2**31 - 2, 2**64 + 2), st.integers(0)),
    )
    def test_fuzz_object_ids_in_the_path_never_500(self, name, pk):
        self.client.force_login(self.approver)

        response = self.client.get(reverse(name, args=[pk]))

        self.assert_no_server_error(response, pk)
