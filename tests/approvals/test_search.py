"""Search: one reading of what was typed, finding tickets and runs of the given tenants only."""

from __future__ import annotations

import pytest

from approvals import search
from approvals.models import Run, Ticket
from tests.support import TenantFactory, stored_run, stored_ticket

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("text", "number", "only", "kept"),
    [
        ("#12", 12, True, "12"),
        ("# 12", 12, True, "12"),
        ("12", 12, False, "12"),
        ("  2026.07.25 ", None, False, "2026.07.25"),
        ("deploy   release", None, False, "deploy release"),
        ("", None, False, ""),
    ],
)
def test_parse_reads_a_number_or_text(text, number, only, kept):
    query = search.parse(text)

    assert (query.number, query.number_only, query.text) == (number, only, kept)


def test_parse_cuts_overlong_text():
    assert len(search.parse("x" * 500).text) == search.MAX_TEXT


def ticket_ids(tenant, text: str) -> list[int]:
    tickets = search.tickets_matching(
        Ticket.objects.filter(tenant=tenant), query=search.parse(text)
    )
    return sorted(tickets.values_list("pk", flat=True))


def test_tickets_matching_finds_the_ticket_of_that_number():
    tenant = TenantFactory()
    wanted = stored_ticket(tenant)
    stored_ticket(tenant)

    assert ticket_ids(tenant, f"#{wanted.pk}") == [wanted.pk]
    assert ticket_ids(tenant, str(wanted.pk)) == [wanted.pk]


def test_tickets_matching_hash_number_ignores_text_that_contains_it():
    tenant = TenantFactory()
    wanted = stored_ticket(tenant)
    stored_ticket(tenant, arguments=f'{{"release":"{wanted.pk}{wanted.pk}"}}')

    assert ticket_ids(tenant, f"#{wanted.pk}") == [wanted.pk]


def test_tickets_matching_finds_an_argument_value():
    tenant = TenantFactory()
    wanted = stored_ticket(tenant, arguments='{"environment":"staging","release":"2026.07.25"}')
    stored_ticket(tenant, arguments='{"environment":"staging","release":"2026.07.24"}')

    assert ticket_ids(tenant, "2026.07.25") == [wanted.pk]


def test_tickets_matching_finds_a_value_with_quotes_as_stored_in_canonical_json():
    tenant = TenantFactory()
    wanted = stored_ticket(tenant, arguments='{"note":"say \\"hi\\" to ops"}')

    assert ticket_ids(tenant, 'say "hi"') == [wanted.pk]


def test_tickets_matching_finds_a_tool_name_and_a_run_title_case_blind():
    tenant = TenantFactory()
    by_tool = stored_ticket(tenant, tool="publish_invoice")
    titled = stored_ticket(tenant, run=stored_run(tenant, title="Rotate the Staging keys"))

    assert ticket_ids(tenant, "INVOICE") == [by_tool.pk]
    assert ticket_ids(tenant, "staging KEYS") == [titled.pk]


def test_runs_matching_finds_a_run_by_number_title_or_a_calls_arguments():
    tenant = TenantFactory()
    titled = stored_run(tenant, title="Deploy release 2026.07.25 to production")
    called = stored_run(tenant, title="Deploy")
    stored_ticket(tenant, run=called, arguments='{"release":"2026.07.25"}')
    stored_ticket(tenant, run=called, arguments='{"release":"2026.07.25","again":true}')
    other = stored_run(tenant, title="Something else")

    def found(text: str) -> list[int]:
        runs = search.runs_matching(Run.objects.filter(tenant=tenant), query=search.parse(text))
        return sorted(runs.values_list("pk", flat=True))

    assert found("2026.07.25") == [titled.pk, called.pk]
    assert found(f"#{other.pk}") == [other.pk]
    assert found("") == sorted([titled.pk, called.pk, other.pk])


def test_search_keeps_to_the_given_tenants():
    mine, theirs = TenantFactory(), TenantFactory()
    wanted = stored_ticket(mine, run=stored_run(mine, title="Release 2026.07.25"))
    stored_ticket(theirs, run=stored_run(theirs, title="Release 2026.07.25"))

    results = search.search(tenant_ids=[mine.pk], text="2026.07.25")

    assert [t.pk for t in results.tickets] == [wanted.pk]
    assert [r.pk for r in results.runs] == [wanted.run_id]


def test_search_by_another_tenants_number_finds_nothing():
    mine, theirs = TenantFactory(), TenantFactory()
    stored_ticket(mine)
    foreign = stored_ticket(theirs)

    by_ticket = search.search(tenant_ids=[mine.pk], text=f"#{foreign.pk}")
    by_run = search.search(tenant_ids=[mine.pk], text=f"#{foreign.run_id}")

    assert by_ticket.tickets == []
    assert {run.tenant_id for run in by_ticket.runs + by_run.runs} <= {mine.pk}
    assert foreign.run_id not in [run.pk for run in by_run.runs]


def test_search_is_bounded_and_says_when_more_matched(django_assert_num_queries):
    tenant = TenantFactory()
    for _ in range(4):
        stored_ticket(tenant, run=stored_run(tenant, title="Nightly deploy"))

    with django_assert_num_queries(2):
        results = search.search(tenant_ids=[tenant.pk], text="nightly", limit=3)

    assert (len(results.tickets), results.more_tickets) == (3, True)
    assert (len(results.runs), results.more_runs) == (3, True)


def test_search_of_nothing_reads_nothing(django_assert_num_queries):
    tenant = TenantFactory()
    stored_ticket(tenant)

    with django_assert_num_queries(0):
        results = search.search(tenant_ids=[tenant.pk], text="   ")

    assert (results.tickets, results.runs) == ([], [])
