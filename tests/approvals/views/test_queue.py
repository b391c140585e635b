"""The queue page: pending tickets of the user's tenants, filtered and paged by keyset."""

from __future__ import annotations

import base64
import json
import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from approvals.core.canonical import arguments_digest
from approvals.decisions.claims import claim
from approvals.models import Role, Run, Ticket, TicketStatus, TicketVote
from approvals.policies.versions import save_policy
from tests.support import TenantFactory, caller_run, member

pytestmark = pytest.mark.django_db

QUEUE = reverse("approvals:queue")


def cheap_run(tenant, *, agent_key: str = "release", requested_by=None) -> Run:
    """A run row without a real state: the queue never opens the blob."""
    return Run.objects.create(
        tenant=tenant,
        agent_key=agent_key,
        agent_version="1",
        schema_version="1.0",
        requested_by=requested_by,
        state_key_id="",
        state_nonce=b"",
        state_ciphertext=b"",
    )


def cheap_ticket(
    tenant,
    *,
    tool: str = "deploy_release",
    arguments: str = '{"environment":"production","release":"2026.07.24"}',
    agent_key: str = "release",
    requested_by=None,
    status: str = TicketStatus.PENDING,
    created_at=None,
) -> Ticket:
    run = cheap_run(tenant, agent_key=agent_key, requested_by=requested_by)
    now = timezone.now()
    return Ticket.objects.create(
        run=run,
        tenant=tenant,
        generation=1,
        agent_name=agent_key,
        tool_name=tool,
        tool_call_id=f"call_{run.pk}",
        arguments_json=arguments,
        arguments_digest="0" * 64,
        requested_by=requested_by,
        created_at=created_at or now,
        expires_at=now + timedelta(days=1),
        status=status,
    )


def shown_ids(response) -> list[int]:
    return [row["ticket"].pk for row in response.context["rows"]]


def test_queue_shows_the_pending_tickets_tool_and_summary(client):
    tenant = TenantFactory()
    ticket = cheap_ticket(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(QUEUE)

    assert response.status_code == 200
    assert shown_ids(response) == [ticket.pk]
    body = response.content.decode()
    assert '<span class="tool">deploy_release</span>' in body
    assert "environment=&quot;production&quot;, release=&quot;2026.07.24&quot;" in body
    assert reverse("approvals:ticket", args=[ticket.pk]) in body


def test_queue_hides_decided_tickets(client):
    tenant = TenantFactory()
    pending = cheap_ticket(tenant)
    for status in (TicketStatus.APPROVED, TicketStatus.REJECTED, TicketStatus.EXPIRED):
        cheap_ticket(tenant, tool=f"tool_{status}", status=status)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(QUEUE)

    assert shown_ids(response) == [pending.pk]
    assert "tool_approved" not in response.content.decode()


def test_queue_empty_says_nothing_is_waiting(client):
    client.force_login(member(TenantFactory(), Role.VIEWER))

    response = client.get(QUEUE)

    assert response.status_code == 200
    assert "Nothing is waiting for you." in response.content.decode()


def test_queue_never_shows_another_tenants_tickets(client):
    mine, theirs = TenantFactory(), TenantFactory()
    own = cheap_ticket(mine)
    cheap_ticket(theirs, tool="their_secret_tool")
    client.force_login(member(mine, Role.APPROVER))

    response = client.get(QUEUE)

    assert shown_ids(response) == [own.pk]
    assert "their_secret_tool" not in response.content.decode()


def test_queue_of_anonymous_user_redirects_to_sign_in(client):
    response = client.get(QUEUE)

    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/"


# --- filters ---------------------------------------------------------------------------------


def test_queue_filters_by_tenant(client):
    one, two = TenantFactory(), TenantFactory()
    user = member(one, Role.VIEWER)
    member(two, Role.VIEWER, username=user.username)
    cheap_ticket(one)
    wanted = cheap_ticket(two)
    client.force_login(user)

    response = client.get(QUEUE, {"tenant": two.slug})

    assert response.status_code == 200
    assert shown_ids(response) == [wanted.pk]


def test_queue_filters_by_agent(client):
    tenant = TenantFactory()
    cheap_ticket(tenant, agent_key="release")
    wanted = cheap_ticket(tenant, agent_key="invoice", tool="publish_invoice")
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(QUEUE, {"agent": "invoice"})

    assert shown_ids(response) == [wanted.pk]


def test_queue_filters_by_tool(client):
    tenant = TenantFactory()
    wanted = cheap_ticket(tenant, tool="deploy_release")
    cheap_ticket(tenant, tool="publish_invoice")
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(QUEUE, {"tool": "deploy_release"})

    assert shown_ids(response) == [wanted.pk]


def test_queue_filters_by_requester(client):
    tenant = TenantFactory()
    alice = member(tenant, Role.VIEWER, username="alice")
    bob = member(tenant, Role.VIEWER, username="bob")
    wanted = cheap_ticket(tenant, requested_by=alice)
    cheap_ticket(tenant, requested_by=bob)
    client.force_login(member(tenant, Role.APPROVER))

    response = client.get(QUEUE, {"requester": "alice"})

    assert shown_ids(response) == [wanted.pk]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"tenant": "nosuch"}, "You are not a member of a tenant called 'nosuch'."),
        ({"agent": "nosuch"}, "There is no agent called 'nosuch'."),
        ({"tool": "drop table;"}, "That is not a valid tool name."),
        ({"requester": "ghost"}, "Nobody called 'ghost' is a member of your tenants."),
    ],
)
def test_queue_unknown_filter_value_is_400_with_the_message(client, params, message):
    tenant = TenantFactory()
    cheap_ticket(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(QUEUE, params)

    assert response.status_code == 400
    assert response.context["rows"] == []
    assert escape(message) in response.content.decode()


def page_without_token(response) -> str:
    return re.sub(r'name="csrfmiddlewaretoken" value="\w+"', "", response.content.decode())


def test_queue_requester_of_another_tenant_is_refused_like_a_name_nobody_has(client):
    tenant, elsewhere = TenantFactory(), TenantFactory()
    member(elsewhere, Role.VIEWER, username="outsider")
    cheap_ticket(elsewhere, requested_by=member(elsewhere, Role.VIEWER, username="insider"))
    client.force_login(member(tenant, Role.VIEWER))

    outside = client.get(QUEUE, {"requester": "outsider"})
    nobody = client.get(QUEUE, {"requester": "nobody00"})

    assert outside.status_code == nobody.status_code == 400
    assert outside.context["form"].errors == {
        "requester": ["Nobody called 'outsider' is a member of your tenants."]
    }
    assert nobody.context["form"].errors == {
        "requester": ["Nobody called 'nobody00' is a member of your tenants."]
    }
    assert page_without_token(outside).replace("outsider", "nobody00") == page_without_token(nobody)


def test_queue_filter_by_another_tenant_is_400_like_an_unknown_one(client):
    mine, theirs = TenantFactory(), TenantFactory()
    cheap_ticket(theirs)
    client.force_login(member(mine, Role.APPROVER))

    response = client.get(QUEUE, {"tenant": theirs.slug})

    assert response.status_code == 400
    assert escape(f"You are not a member of a tenant called '{theirs.slug}'.") in (
        response.content.decode()
    )


@pytest.mark.parametrize("cursor", ["not-base64!", "W10", "WyJ4IiwgMV0"])
def test_queue_broken_after_cursor_is_400(client, cursor):
    tenant = TenantFactory()
    cheap_ticket(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(QUEUE, {"after": cursor})

    assert response.status_code == 400
    assert "that page link is broken or out of date" in response.content.decode()


@pytest.mark.parametrize(
    "values", [["9999-12-31T23:59:59-12:00", 1], ["0001-01-01T00:00:00+12:00", 1]]
)
def test_queue_forged_cursor_outside_the_datetime_range_is_400(client, values):
    # Valid base64 and JSON, but the datetime cannot be brought to UTC for the query.
    tenant = TenantFactory()
    cheap_ticket(tenant)
    client.force_login(member(tenant, Role.VIEWER))
    client.raise_request_exception = False
    cursor = base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")

    response = client.get(QUEUE, {"after": cursor})

    assert response.status_code == 400
    assert "that page link is broken or out of date" in response.content.decode()


def test_queue_oversized_cursor_is_400(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(QUEUE, {"after": "A" * 501})

    assert response.status_code == 400
    assert "Ensure this value has at most 500 characters (it has 501)." in (
        response.content.decode()
    )


# --- pages -----------------------------------------------------------------------------------


def test_queue_pages_by_keyset_without_duplicates_or_gaps(client):
    tenant = TenantFactory()
    now = timezone.now()
    # Ties on created_at cross page boundaries: the id breaks them.
    tickets = [
        cheap_ticket(tenant, created_at=now - timedelta(seconds=index // 7)) for index in range(60)
    ]
    client.force_login(member(tenant, Role.VIEWER))

    pages: list[list[int]] = []
    query = ""
    while True:
        response = client.get(f"{QUEUE}?{query}")
        assert response.status_code == 200
        pages.append(shown_ids(response))
        query = response.context["next_query"]
        if not query:
            break

    assert [len(page) for page in pages] == [25, 25, 10]
    expected = [t.pk for t in sorted(tickets, key=lambda t: (t.created_at, t.pk), reverse=True)]
    assert [pk for page in pages for pk in page] == expected


def test_queue_next_link_keeps_the_filters(client):
    tenant = TenantFactory()
    for _ in range(26):
        cheap_ticket(tenant, tool="deploy_release")
    cheap_ticket(tenant, tool="publish_invoice")
    client.force_login(member(tenant, Role.VIEWER))

    first = client.get(QUEUE, {"tool": "deploy_release"})
    second = client.get(f"{QUEUE}?{first.context['next_query']}")

    assert "tool=deploy_release" in first.context["next_query"]
    assert len(shown_ids(second)) == 1
    assert second.context["rows"][0]["ticket"].tool_name == "deploy_release"


def queries_for(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


def test_queue_queries_do_not_grow_with_rows(client, django_assert_num_queries):
    tenant = TenantFactory()
    requester = member(tenant, Role.VIEWER)
    cheap_ticket(tenant, requested_by=requester)
    client.force_login(member(tenant, Role.APPROVER))
    at_one = queries_for(client, QUEUE)

    for index in range(49):
        cheap_ticket(
            tenant,
            tool=f"tool_{index % 5}",
            requested_by=member(tenant, Role.VIEWER),
            agent_key=("release", "invoice")[index % 2],
        )
    with django_assert_num_queries(at_one):
        response = client.get(QUEUE)
    assert len(shown_ids(response)) == 25


def test_queue_htmx_request_for_rows_returns_the_partial_only(client):
    tenant = TenantFactory()
    ticket = cheap_ticket(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(QUEUE, headers={"HX-Request": "true", "HX-Target": "queue-rows"})

    body = response.content.decode().strip()
    assert response.status_code == 200
    assert body.startswith('<div id="queue-rows"')
    assert body.endswith("</div>")
    assert "<html" not in body
    assert 'class="filters"' not in body
    assert f'id="ticket-row-{ticket.pk}"' in body


def test_queue_uses_the_tenant_chosen_in_the_switcher(client):
    one, two = TenantFactory(), TenantFactory()
    user = member(one, Role.VIEWER)
    member(two, Role.VIEWER, username=user.username)
    cheap_ticket(one)
    wanted = cheap_ticket(two)
    client.force_login(user)
    session = client.session
    session["console_tenant"] = two.slug
    session.save()

    chosen = client.get(QUEUE)
    everything = client.get(f"{QUEUE}?{urlencode({'tenant': ''})}")

    assert shown_ids(chosen) == [wanted.pk]
    assert len(shown_ids(everything)) == 2


# --- what a row says: number, run, quorum, whether the run can resume ---------------------------


def voted_ticket(tenant, admin, *, tool: str, voter) -> Ticket:
    """A pending ticket governed by a two-approval policy of its tool, with one vote."""
    policy = save_policy(tenant=tenant, user=admin, tool_name=tool, required_approvals=2)
    ticket = cheap_ticket(tenant, tool=tool)
    Ticket.objects.filter(pk=ticket.pk).update(policy=policy)
    TicketVote.objects.create(ticket=ticket, user=voter, policy=policy)
    return ticket


def test_queue_row_shows_the_ticket_number_and_the_run_title_linked(client):
    tenant = TenantFactory()
    ticket = cheap_ticket(tenant)
    Run.objects.filter(pk=ticket.run_id).update(title="Deploy release 2026.07.24 to production")
    client.force_login(member(tenant, Role.VIEWER))

    body = client.get(QUEUE).content.decode()

    assert f'<span class="ticket-no">#{ticket.pk}</span>' in body
    assert (
        f'<a class="run-link" href="/runs/{ticket.run_id}/" id="run-link-{ticket.pk}">'
        f'Run #{ticket.run_id}: <span class="run-title">Deploy release 2026.07.24 to production'
        "</span></a>"
    ) in body


def test_queue_row_shows_quorum_progress(client):
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN)
    voted = voted_ticket(tenant, admin, tool="deploy_release", voter=member(tenant, Role.APPROVER))
    plain = cheap_ticket(tenant, tool="publish_invoice")
    client.force_login(member(tenant, Role.VIEWER))

    body = client.get(QUEUE).content.decode()

    assert f'id="progress-{voted.pk}" class="has-votes">1 of 2 approvals</td>' in body
    assert f'id="progress-{plain.pk}" class="">0 of 1 approval</td>' in body


def test_queue_queries_do_not_grow_with_votes_and_policies(client, django_assert_num_queries):
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN)
    voted_ticket(tenant, admin, tool="tool_0", voter=member(tenant, Role.APPROVER))
    client.force_login(member(tenant, Role.APPROVER))
    at_one = queries_for(client, QUEUE)

    for index in range(1, 20):
        voted_ticket(tenant, admin, tool=f"tool_{index}", voter=member(tenant, Role.APPROVER))
    with django_assert_num_queries(at_one):
        response = client.get(QUEUE)
    assert len(shown_ids(response)) == 20
    assert {row["progress"].tally() for row in response.context["rows"]} == {"1 of 2 approvals"}


def test_queue_flags_a_run_that_cannot_resume_and_keeps_it_out_of_a_batch(client):
    tenant = TenantFactory()
    ticket = cheap_ticket(tenant)
    Ticket.objects.filter(pk=ticket.pk).update(
        arguments_digest=arguments_digest(ticket.arguments_json)
    )
    gone = cheap_ticket(tenant)
    Ticket.objects.filter(pk=gone.pk).update(arguments_digest=arguments_digest(gone.arguments_json))
    Run.objects.filter(pk=gone.run_id).update(agent_version="9")
    client.force_login(member(tenant, Role.APPROVER))

    body = client.get(QUEUE).content.decode()

    assert f'id="cannot-resume-{gone.pk}"' in body
    assert f'id="cannot-resume-{ticket.pk}"' not in body
    assert f'name="ticket" value="{ticket.pk}"' in body
    assert f'name="ticket" value="{gone.pk}"' not in body


def test_queue_does_not_flag_a_callers_run_of_an_agent_the_console_lacks(client):
    tenant = TenantFactory()
    ticket = Ticket.objects.get(run=caller_run(tenant, requested_by=member(tenant, Role.VIEWER)))
    Run.objects.filter(pk=ticket.run_id).update(agent_key="pipeline-release")
    client.force_login(member(tenant, Role.APPROVER))

    body = client.get(QUEUE).content.decode()

    assert f'id="cannot-resume-{ticket.pk}"' not in body
    assert f'name="ticket" value="{ticket.pk}"' in body


@pytest.mark.parametrize(
    ("role", "expected"),
    [(Role.APPROVER, ["j/k", "Enter", "x"]), (Role.VIEWER, ["j/k", "Enter"])],
)
def test_queue_keys_are_the_ones_that_work_here(client, role, expected):
    tenant = TenantFactory()
    cheap_ticket(tenant)
    client.force_login(member(tenant, role))

    body = client.get(QUEUE).content.decode()

    assert re.findall(r'data-hint="([^"]+)"', body) == expected
    assert "<kbd>a</kbd>" not in body
    assert "<kbd>r</kbd>" not in body


def test_queue_rows_show_their_claimants_and_tenants_in_queries_that_do_not_grow(
    client, django_assert_num_queries
):
    one, two = TenantFactory(slug="one"), TenantFactory(slug="two")
    viewer = member(one, Role.APPROVER, username="vic")
    member(two, Role.APPROVER, username="vic")
    first = cheap_ticket(one)
    claimants = [member(one, Role.APPROVER, username="ann")]
    claim(first, user=claimants[0])
    client.force_login(viewer)
    at_one = queries_for(client, f"{QUEUE}?tenant=")

    claimed = [first]
    for index in range(10):
        tenant = (one, two)[index % 2]
        ticket = cheap_ticket(tenant)
        if index % 3 == 0:
            claimants.append(member(tenant, Role.APPROVER, username=f"cl{index}"))
            claim(ticket, user=claimants[-1])
            claimed.append(ticket)
    with django_assert_num_queries(at_one):
        body = client.get(f"{QUEUE}?tenant=").content.decode()

    for ticket, who in zip(claimed, claimants, strict=True):
        assert (
            f'<span class="claim-badge" id="claim-badge-{ticket.pk}">{who.username} is on it'
            in body
        )
    assert body.count('<td data-label="Tenant">one</td>') == 6
    assert body.count('<td data-label="Tenant">two</td>') == 5


def test_queue_reads_its_tickets_joined_to_their_runs_and_requesters_alone(client):
    # Every further join (tenant, policy, claimant) cost PostgreSQL milliseconds of planning on
    # each request: those are read from the memberships, or after, in a query of their own.
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN)
    voted_ticket(tenant, admin, tool="deploy_release", voter=member(tenant, Role.APPROVER))
    client.force_login(member(tenant, Role.VIEWER))

    with CaptureQueriesContext(connection) as captured:
        assert client.get(f"{QUEUE}?tenant={tenant.slug}").status_code == 200

    (page,) = [q["sql"] for q in captured if 'FROM "approvals_ticket"' in q["sql"]]
    joined = re.findall(r'JOIN "(\w+)"', page)
    assert joined == ["approvals_run", "auth_user"]


def test_the_queue_page_selects_the_options_chosen_and_no_other(client):
    tenant = TenantFactory(slug="acme")
    member(tenant, Role.VIEWER, username="req")
    client.force_login(member(tenant, Role.VIEWER, username="viewer"))

    body = client.get(QUEUE, {"requester": "req", "tenant": "acme"})
    body = body.content.decode()

    assert body.count(" selected>") == 2
    assert '<option value="req" selected>req</option>' in body
    assert '<option value="acme" selected>acme</option>' in body
