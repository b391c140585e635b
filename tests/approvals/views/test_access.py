"""The one lookup per object kind: the object asked for, in one of the user's tenants, or 404;
and the user's tenants by what they may do there."""

from __future__ import annotations

import pytest
from django.http import Http404
from django.test import RequestFactory

from approvals.models import Role, Ticket
from approvals.views import access
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db


def request_of(user, *, query: str = "", session: dict | None = None):
    request = RequestFactory().get(f"/somewhere/{query}")
    request.user = user
    request.session = session or {}
    return request


@pytest.fixture
def two_tenants():
    acme, globex = TenantFactory(slug="acme"), TenantFactory(slug="globex")
    alice = member(acme, Role.APPROVER, username="alice")
    member(globex, Role.ADMIN, username="alice")
    return acme, globex, alice


def test_memberships_are_the_users_by_tenant_read_once_per_request(
    two_tenants, django_assert_num_queries
):
    acme, globex, alice = two_tenants
    member(acme, Role.ADMIN, username="bob")
    request = request_of(alice)

    with django_assert_num_queries(1):
        mine = access.memberships(request)
        again = access.memberships(request)
        tenants = {tenant_id: m.tenant.slug for tenant_id, m in mine.items()}

    assert again is mine
    assert tenants == {acme.pk: "acme", globex.pk: "globex"}
    assert {m.role for m in mine.values()} == {Role.APPROVER, Role.ADMIN}


def test_get_run_for_user_is_the_run_asked_for_with_its_membership(
    two_tenants, django_assert_num_queries
):
    acme, globex, alice = two_tenants
    paused_run(acme)
    wanted = paused_run(globex, requested_by=alice)
    paused_run(acme)
    request = request_of(alice)
    access.memberships(request)

    with django_assert_num_queries(1):
        run, membership = access.get_run_for_user(request, wanted.pk)
        shown = (run.tenant.slug, run.requested_by.username)

    assert run.pk == wanted.pk
    assert shown == ("globex", "alice")
    assert (membership.tenant_id, membership.role) == (globex.pk, Role.ADMIN)


def test_get_run_for_user_of_another_tenant_is_404(two_tenants):
    _, _, alice = two_tenants
    elsewhere = paused_run(TenantFactory(slug="initech"))

    with pytest.raises(Http404) as raised:
        access.get_run_for_user(request_of(alice), elsewhere.pk)

    assert str(raised.value) == "No such run."


def test_get_ticket_for_user_is_the_ticket_asked_for_with_its_membership(
    two_tenants, django_assert_num_queries
):
    acme, globex, alice = two_tenants
    paused_run(acme)
    wanted = Ticket.objects.get(run=paused_run(globex, requested_by=alice))
    paused_run(acme)
    request = request_of(alice)
    access.memberships(request)

    with django_assert_num_queries(1):
        ticket, membership = access.get_ticket_for_user(request, wanted.pk)
        shown = (ticket.run.pk, ticket.tenant.slug, ticket.requested_by.username, ticket.decided_by)

    assert ticket.pk == wanted.pk
    assert shown == (wanted.run_id, "globex", "alice", None)
    assert (membership.tenant_id, membership.role) == (globex.pk, Role.ADMIN)


def test_get_ticket_for_user_reads_who_decided_it_in_the_same_query(
    two_tenants, django_assert_num_queries
):
    acme, globex, alice = two_tenants
    bob = member(globex, Role.APPROVER, username="bob")
    decided = Ticket.objects.get(run=paused_run(globex, requested_by=alice))
    Ticket.objects.filter(pk=decided.pk).update(decided_by=bob)
    request = request_of(alice)
    access.memberships(request)

    with django_assert_num_queries(1):
        ticket, _ = access.get_ticket_for_user(request, decided.pk)
        assert ticket.decided_by.username == "bob"


def test_get_ticket_for_user_of_another_tenant_is_404(two_tenants):
    _, _, alice = two_tenants
    elsewhere = Ticket.objects.get(run=paused_run(TenantFactory(slug="initech")))

    with pytest.raises(Http404) as raised:
        access.get_ticket_for_user(request_of(alice), elsewhere.pk)

    assert str(raised.value) == "No such ticket."


def test_active_tenant_is_the_session_choice_only_among_the_users_tenants(two_tenants):
    _, _, alice = two_tenants
    TenantFactory(slug="initech")

    assert access.active_tenant(request_of(alice, session={"console_tenant": "globex"})) == (
        "globex"
    )
    assert access.active_tenant(request_of(alice, session={"console_tenant": "initech"})) == ""
    assert access.active_tenant(request_of(alice)) == ""


def test_with_query_changes_the_given_parameters_and_keeps_the_others(two_tenants):
    _, _, alice = two_tenants
    request = request_of(alice, query="?status=pending&page=3")

    assert access.with_query(request, page="4") == "status=pending&page=4"
    assert access.with_query(request, tenant="acme") == "status=pending&page=3&tenant=acme"
    assert request.GET.urlencode() == "status=pending&page=3"


def test_admin_and_history_tenants_are_those_the_users_role_allows(two_tenants):
    acme, globex, alice = two_tenants
    initech = TenantFactory(slug="initech")
    member(initech, Role.AUDITOR, username="alice")
    request = request_of(alice)

    assert access.admin_tenants(request) == {"globex": globex}
    assert access.history_tenants(request) == {globex.pk: globex, initech.pk: initech}


def test_active_tenant_without_a_choice_is_none_whatever_the_tenants_are_called():
    tenant = TenantFactory(slug="XXXX")
    alice = member(tenant, Role.ADMIN, username="alice")

    assert access.active_tenant(request_of(alice)) == ""


def test_get_admin_tenant_of_a_tenant_the_user_does_not_administer_is_404_saying_no_more(
    two_tenants,
):
    acme, globex, alice = two_tenants

    assert access.get_admin_tenant(request_of(alice), "globex") == globex
    assert access.get_admin_tenant(request_of(alice), "") == globex
    for slug in ("acme", "initech"):
        with pytest.raises(Http404) as raised:
            access.get_admin_tenant(request_of(alice), slug)
        assert str(raised.value) == "No such page."
