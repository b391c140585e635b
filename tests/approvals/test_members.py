from __future__ import annotations

import pytest

from approvals import members
from approvals.models import Membership, Role, Ticket
from tests.support import TenantFactory, UserFactory, member, paused_run

pytestmark = pytest.mark.django_db


def test_roles_of_gives_each_user_their_role_in_each_tenant():
    first, second = TenantFactory(), TenantFactory()
    alice = member(first, Role.ADMIN)
    member(second, Role.VIEWER, username=alice.username)
    bob = member(second, Role.APPROVER)
    outsider = UserFactory()

    roles = members.roles_of([alice.pk, bob.pk, outsider.pk])

    assert roles == {
        alice.pk: {first.pk: Role.ADMIN, second.pk: Role.VIEWER},
        bob.pk: {second.pk: Role.APPROVER},
        outsider.pk: {},
    }


def test_roles_of_leaves_out_users_not_asked_about():
    tenant = TenantFactory()
    alice = member(tenant, Role.ADMIN)
    member(tenant, Role.APPROVER)

    assert members.roles_of([alice.pk]) == {alice.pk: {tenant.pk: Role.ADMIN}}


def test_membership_for_an_inactive_user_is_none():
    tenant = TenantFactory()
    alice = member(tenant, Role.ADMIN)
    alice.is_active = False
    alice.save(update_fields=["is_active"])

    assert members.membership_for(alice, tenant.pk) is None
    assert members.is_admin(alice, tenant.pk) is False


def test_membership_for_takes_a_known_membership_of_the_user_in_the_tenant(
    django_assert_num_queries,
):
    tenant = TenantFactory()
    alice = member(tenant, Role.APPROVER)
    known = Membership.objects.get(user=alice, tenant=tenant)

    with django_assert_num_queries(0):
        assert members.membership_for(alice, tenant.pk, known=known) is known


def test_membership_for_reads_again_a_known_membership_of_another_user_or_tenant():
    tenant, other = TenantFactory(), TenantFactory()
    alice = member(tenant, Role.VIEWER)
    bob = member(tenant, Role.ADMIN)
    member(other, Role.ADMIN, username=alice.username)
    alices_elsewhere = Membership.objects.get(user=alice, tenant=other)
    bobs = Membership.objects.get(user=bob, tenant=tenant)

    assert members.membership_for(alice, tenant.pk, known=alices_elsewhere).role == Role.VIEWER
    assert members.membership_for(alice, tenant.pk, known=bobs).role == Role.VIEWER


def test_membership_for_an_inactive_user_with_a_known_membership_is_none():
    tenant = TenantFactory()
    alice = member(tenant, Role.ADMIN)
    known = Membership.objects.get(user=alice, tenant=tenant)
    alice.is_active = False

    assert members.membership_for(alice, tenant.pk, known=known) is None


def test_membership_for_no_user_is_none():
    assert members.membership_for(None, TenantFactory().pk) is None


def test_is_member_named_only_in_the_tenants_named():
    first, second = TenantFactory(), TenantFactory()
    member(second, Role.APPROVER, username="bob")

    assert members.is_member_named("bob", tenant_slugs=[first.slug]) is False
    assert members.is_member_named("bob", tenant_slugs=[first.slug, second.slug]) is True


def test_memberships_in_are_the_users_asked_about_in_that_tenant_only():
    first, second = TenantFactory(), TenantFactory()
    alice = member(first, Role.ADMIN)
    member(second, Role.VIEWER, username=alice.username)
    bob = member(first, Role.APPROVER)
    carol = member(second, Role.APPROVER)

    found = members.memberships_in([alice, carol], first.pk)

    assert {user_id: (m.tenant_id, m.role) for user_id, m in found.items()} == {
        alice.pk: (first.pk, Role.ADMIN)
    }
    assert bob.pk not in found
    in_second = members.memberships_in([alice, bob, carol], second.pk)
    assert {user_id: (m.tenant_id, m.role) for user_id, m in in_second.items()} == {
        alice.pk: (second.pk, Role.VIEWER),
        carol.pk: (second.pk, Role.APPROVER),
    }


def test_has_membership_is_whether_the_rows_own_user_belongs_to_the_rows_own_tenant():
    first, second = TenantFactory(), TenantFactory()
    alice = member(first, Role.APPROVER)
    bob = member(second, Role.APPROVER)
    # A ticket names a user (its requester) and a tenant: the row the annotation is read on.
    ticket = Ticket.objects.filter(run=paused_run(first, requested_by=alice))

    def has(user, tenant) -> bool:
        ticket.update(requested_by=user, tenant=tenant)
        annotated = ticket.annotate(member=members.has_membership("requested_by_id", "tenant_id"))
        return annotated.get().member

    assert has(alice, first) is True
    assert has(bob, first) is False
    assert has(alice, second) is False
    assert has(bob, second) is True


@pytest.mark.parametrize(
    ("active", "has_membership", "expected"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_is_member_needs_both_the_membership_and_an_active_account(
    active, has_membership, expected
):
    user = UserFactory(is_active=active)

    assert members.is_member(user, has_membership=has_membership) is expected


def test_role_in_is_the_rows_users_role_in_the_tenant_asked_about():
    first, second = TenantFactory(), TenantFactory()
    alice = member(first, Role.APPROVER)
    Membership.objects.create(user=alice, tenant=second, role=Role.ADMIN)
    bob = member(second, Role.VIEWER)
    ticket = Ticket.objects.filter(run=paused_run(first, requested_by=alice))

    def role(user, tenant) -> str | None:
        ticket.update(requested_by=user)
        return ticket.annotate(role=members.role_in(tenant.pk, "requested_by_id")).get().role

    assert role(alice, first) == Role.APPROVER
    assert role(alice, second) == Role.ADMIN
    assert role(bob, first) is None
    assert role(bob, second) == Role.VIEWER


def test_membership_from_role_is_what_membership_for_says():
    tenant = TenantFactory()
    alice = member(tenant, Role.APPROVER)

    found = members.membership_from_role(alice, tenant.pk, Role.APPROVER)

    expected = members.membership_for(alice, tenant.pk)
    assert (found.user, found.tenant_id, found.role) == (
        expected.user,
        expected.tenant_id,
        expected.role,
    )
    assert found.can_decide


@pytest.mark.parametrize(("active", "role"), [(True, None), (False, Role.APPROVER)])
def test_membership_from_role_without_a_role_or_an_active_account_is_none(active, role):
    tenant = TenantFactory()
    user = UserFactory(is_active=active)

    assert members.membership_from_role(user, tenant.pk, role) is None
