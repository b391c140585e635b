"""The queue's history: the Decided tab, "My decisions", the search page, and the queue's empty
state that leads to them."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals.models import PreAuthorization, Role, RunStatus, TicketStatus, TicketVote
from approvals.policies.versions import save_policy
from tests.support import TenantFactory, member, queries_for, stored_run, stored_ticket

pytestmark = pytest.mark.django_db

DECIDED = reverse("approvals:decided")
MINE = reverse("approvals:my-decisions")
SEARCH = reverse("approvals:search")


def shown(response) -> list[int]:
    return [row["ticket"].pk for row in response.context["rows"]]


def decided_ticket(tenant, *, status=TicketStatus.APPROVED, by=None, at=None, **fields):
    return stored_ticket(
        tenant,
        status=status,
        decided_by=by,
        decided_at=at or timezone.now(),
        **fields,
    )


# --- the Decided tab ----------------------------------------------------------------------------


def test_decided_lists_decided_tickets_with_decider_message_and_run(client):
    tenant = TenantFactory()
    alice = member(tenant, Role.APPROVER, username="rm-alice")
    run = stored_run(tenant, title="Deploy release 2026.07.24 to production")
    rejected = decided_ticket(
        tenant, status=TicketStatus.REJECTED, by=alice, run=run, decision_message="Not on Friday"
    )
    stored_ticket(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(DECIDED)
    body = response.content.decode()

    assert response.status_code == 200
    assert shown(response) == [rejected.pk]
    assert f'<span class="ticket-no">#{rejected.pk}</span>' in body
    assert '<span class="badge status-rejected">Rejected</span>' in body
    assert '<td data-label="Decided by">rm-alice</td>' in body
    assert "Not on Friday" in body
    assert (
        f'<a class="run-link" href="/runs/{run.pk}/" id="run-link-{rejected.pk}">Run #{run.pk}: '
        '<span class="run-title">Deploy release 2026.07.24 to production</span></a>'
    ) in body
    assert 'id="tab-decided" aria-current="page"' in body


def test_decided_shows_every_final_status_and_who_or_what_decided(client):
    tenant = TenantFactory()
    expired = decided_ticket(tenant, status=TicketStatus.EXPIRED, decision_source="expiry")
    superseded = stored_ticket(tenant, status=TicketStatus.SUPERSEDED)
    by_rule = decided_ticket(tenant, decision_source="rule", decision_reason="#1")
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(DECIDED)
    body = response.content.decode()

    assert shown(response) == [by_rule.pk, superseded.pk, expired.pk]
    assert "automatically, by rule" in body
    assert "nobody: it expired" in body
    assert "nobody: the run ended" in body


def test_decided_never_shows_another_tenants_tickets(client):
    mine, theirs = TenantFactory(), TenantFactory()
    wanted = decided_ticket(mine)
    decided_ticket(theirs)
    client.force_login(member(mine, Role.VIEWER))

    assert shown(client.get(DECIDED)) == [wanted.pk]


def test_decided_post_is_refused(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.APPROVER))

    assert client.post(DECIDED).status_code == 405


def test_decided_filters_by_status_tool_decider_date_and_search(client):
    tenant = TenantFactory()
    alice = member(tenant, Role.APPROVER)
    bob = member(tenant, Role.APPROVER)
    now = timezone.now()
    approved = decided_ticket(tenant, by=alice, arguments='{"release":"2026.07.25"}')
    rejected = decided_ticket(tenant, status=TicketStatus.REJECTED, by=bob, tool="publish_invoice")
    old = decided_ticket(tenant, by=bob, at=now - timedelta(days=9))
    client.force_login(member(tenant, Role.VIEWER))

    def found(**params) -> list[int]:
        response = client.get(f"{DECIDED}?{urlencode(params)}")
        assert response.status_code == 200
        return shown(response)

    assert found(status="rejected") == [rejected.pk]
    assert found(tool="publish_invoice") == [rejected.pk]
    assert found(decider=alice.username) == [approved.pk]
    assert found(until=(now - timedelta(days=5)).date().isoformat()) == [old.pk]
    assert found(q="2026.07.25") == [approved.pk]
    assert found(q=f"#{old.pk}") == [old.pk]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "pending"}, "There is no status called &#x27;pending&#x27; here."),
        ({"decider": "nobody-at-all"}, "Nobody called &#x27;nobody-at-all&#x27; is a member"),
        ({"tool": "bad name!"}, "That is not a valid tool name."),
    ],
)
def test_decided_unusable_filter_is_400_with_the_reason(client, params, message):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(f"{DECIDED}?{urlencode(params)}")

    assert response.status_code == 400
    assert message in response.content.decode()


def test_decided_queries_do_not_grow_with_rows(client, django_assert_num_queries):
    tenant = TenantFactory()
    decided_ticket(tenant, by=member(tenant, Role.APPROVER), requested_by=member(tenant))
    client.force_login(member(tenant, Role.VIEWER))
    at_one = queries_for(client, DECIDED)

    for _ in range(2):
        decided_ticket(tenant, by=member(tenant, Role.APPROVER), requested_by=member(tenant))
    with django_assert_num_queries(at_one):
        response = client.get(DECIDED)
    assert len(shown(response)) == 3


def test_decided_pages_by_keyset(client):
    tenant = TenantFactory()
    now = timezone.now()
    tickets = [decided_ticket(tenant, created_at=now - timedelta(minutes=i)) for i in range(27)]
    client.force_login(member(tenant, Role.VIEWER))

    first = client.get(DECIDED)
    second = client.get(f"{DECIDED}?{first.context['next_query']}")

    assert shown(first) + shown(second) == [t.pk for t in tickets]


# --- my decisions -------------------------------------------------------------------------------


def test_my_decisions_shows_my_vote_and_the_final_outcome(client):
    tenant = TenantFactory()
    me = member(tenant, Role.APPROVER)
    other = member(tenant, Role.APPROVER)
    run = stored_run(tenant, status=RunStatus.COMPLETED)
    approved = decided_ticket(tenant, by=me, run=run)
    TicketVote.objects.create(ticket=approved, user=me)
    rejected = decided_ticket(tenant, status=TicketStatus.REJECTED, by=me)
    decided_ticket(tenant, by=other)
    client.force_login(me)

    response = client.get(MINE)
    body = response.content.decode()

    assert response.status_code == 200
    assert shown(response) == [rejected.pk, approved.pk]
    assert (
        f'id="my-part-{approved.pk}">You approved, and your approval completed the quorum</td>'
    ) in body
    assert f'id="my-part-{rejected.pk}">You rejected</td>' in body
    assert '<td data-label="Run"><span class="badge status-completed">Completed</span></td>' in body
    assert 'id="tab-mine" aria-current="page"' in body


def test_my_decisions_shows_a_vote_still_waiting_for_the_quorum(client):
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN)
    me = member(tenant, Role.APPROVER)
    policy = save_policy(
        tenant=tenant, user=admin, tool_name="deploy_release", required_approvals=2
    )
    waiting = stored_ticket(tenant, policy=policy)
    TicketVote.objects.create(ticket=waiting, user=me, policy=policy)
    client.force_login(me)

    body = client.get(MINE).content.decode()

    assert f'id="my-part-{waiting.pk}">You approved</td>' in body
    assert (
        f'<td data-label="Ticket" id="outcome-{waiting.pk}"><span class="badge status-pending">'
        'Pending</span> <span class="muted">1 of 2 approvals</span></td>'
    ) in body


def test_my_decisions_says_when_my_vote_was_set_aside_or_i_edited(client):
    tenant = TenantFactory()
    me = member(tenant, Role.APPROVER)
    set_aside = decided_ticket(tenant, status=TicketStatus.EXPIRED)
    TicketVote.objects.create(
        ticket=set_aside,
        user=me,
        invalidated_at=timezone.now(),
        invalidated_reason="the policy changed",
    )
    edited = decided_ticket(tenant, status=TicketStatus.REJECTED, by=me)
    PreAuthorization.objects.create(
        tenant=tenant,
        run=edited.run,
        tool_name=edited.tool_name,
        arguments_json="{}",
        arguments_digest="0" * 64,
        original_ticket=edited,
        created_by=me,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    client.force_login(me)

    body = client.get(MINE).content.decode()

    assert (
        f'id="my-part-{set_aside.pk}">You approved; the approval was set aside: the policy changed'
    ) in body
    assert f'id="my-part-{edited.pk}">You edited the call and approved your version</td>' in body


def test_my_decisions_never_shows_another_tenants_tickets(client):
    mine, theirs = TenantFactory(), TenantFactory()
    me = member(mine, Role.APPROVER)
    member(theirs, Role.APPROVER, username=me.username)
    decided_ticket(theirs, by=me)
    # The user has left the other tenant: its tickets are gone from their history.
    me.memberships.filter(tenant=theirs).delete()
    client.force_login(me)

    assert shown(client.get(MINE)) == []


def test_my_decisions_of_a_viewer_says_they_decide_nothing(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.VIEWER))

    body = client.get(MINE).content.decode()

    assert "You do not decide tickets in any of your tenants." in body
    assert 'id="tab-mine"' not in body


def test_my_decisions_post_is_refused(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.APPROVER))

    assert client.post(MINE).status_code == 405


def test_my_decisions_queries_do_not_grow_with_rows(client, django_assert_num_queries):
    tenant = TenantFactory()
    me = member(tenant, Role.APPROVER)
    TicketVote.objects.create(ticket=decided_ticket(tenant, by=me), user=me)
    client.force_login(me)
    at_one = queries_for(client, MINE)

    for _ in range(2):
        TicketVote.objects.create(ticket=stored_ticket(tenant), user=me)
    with django_assert_num_queries(at_one):
        response = client.get(MINE)
    assert len(shown(response)) == 3


# --- the search page ----------------------------------------------------------------------------


def test_search_finds_tickets_and_runs_by_an_argument_value(client):
    tenant = TenantFactory()
    run = stored_run(tenant, title="Deploy release 2026.07.25 to staging")
    ticket = stored_ticket(tenant, run=run, arguments='{"release":"2026.07.25"}')
    stored_ticket(tenant, arguments='{"release":"2026.07.24"}')
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(f"{SEARCH}?q=2026.07.25")
    body = response.content.decode()

    assert response.status_code == 200
    assert [row["ticket"].pk for row in response.context["ticket_rows"]] == [ticket.pk]
    assert [r.pk for r in response.context["results"].runs] == [run.pk]
    assert f'id="found-ticket-{ticket.pk}"' in body
    assert f'id="found-run-{run.pk}"' in body
    assert 'value="2026.07.25"' in body


def test_search_by_number_finds_the_ticket(client):
    tenant = TenantFactory()
    ticket = stored_ticket(tenant)
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(f"{SEARCH}?{urlencode({'q': f'#{ticket.pk}'})}")

    assert [row["ticket"].pk for row in response.context["ticket_rows"]] == [ticket.pk]


def test_search_never_finds_another_tenants_rows(client):
    mine, theirs = TenantFactory(), TenantFactory()
    foreign = stored_ticket(theirs, run=stored_run(theirs, title="Their 2026.07.25"))
    client.force_login(member(mine, Role.VIEWER))

    response = client.get(f"{SEARCH}?{urlencode({'q': f'#{foreign.pk}'})}")
    by_text = client.get(f"{SEARCH}?q=2026.07.25")

    assert response.context["ticket_rows"] == []
    assert by_text.context["results"].runs == []
    assert "Their 2026.07.25" not in by_text.content.decode()


def test_search_without_words_asks_for_some(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.VIEWER))

    body = client.get(SEARCH).content.decode()

    assert "Type a few words above, or a ticket or run number." in body


def test_search_overlong_text_is_400_with_the_reason(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.VIEWER))

    response = client.get(f"{SEARCH}?q={'x' * 101}")

    assert response.status_code == 400
    assert "Ensure this value has at most 100 characters" in response.content.decode()


def test_search_post_is_refused(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.VIEWER))

    assert client.post(SEARCH).status_code == 405


# --- the queue leads to the history -------------------------------------------------------------


def test_queue_empty_state_links_the_decided_tab_and_the_runs(client):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.APPROVER))

    body = client.get(reverse("approvals:queue")).content.decode()

    assert "Nothing is waiting for you." in body
    assert '<a href="/decided/" id="empty-decided">See what was decided</a>' in body
    assert '<a href="/runs/" id="empty-runs">See every run</a>' in body
    assert 'id="tab-waiting" aria-current="page"' in body
    assert '<a href="/decisions/mine/" id="tab-mine"' in body


@pytest.mark.parametrize("url", [DECIDED, MINE])
def test_history_rows_are_a_keyboard_list_with_its_keys(client, url):
    tenant = TenantFactory()
    me = member(tenant, Role.APPROVER)
    ticket = decided_ticket(tenant, by=me)
    client.force_login(me)

    body = client.get(url).content.decode()

    assert f'<tr data-row id="{"decided" if url == DECIDED else "mine"}-row-{ticket.pk}">' in body
    assert re.findall(r'data-hint="([^"]+)"', body) == ["j/k", "Enter"]
