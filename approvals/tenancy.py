"""Tenants and their members: create a tenant, add a member, remove one, set a member's role.

The operator's commands call these functions, and a console page would call the same ones, so
every entry point refuses the same things with the same sentence. Each change is one
transaction under the tenant row's lock (two changes of one tenant's members never interleave,
so a tenant cannot lose its last admin to two removals at once), and each is audited.

A membership saved or deleted is heard by the member's open sockets after commit
(approvals.live.memberships, and the audit event for a web process on the in-memory layer):
a removed member stops hearing the tenant at once. A member removed, or given another role, is
also signed out everywhere after commit (approvals.signins.end_sessions): their sessions end and
their open pages' sockets close, so what they may do is read afresh when they sign in again.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.validators import validate_email, validate_slug
from django.db import IntegrityError, transaction

from approvals import signins
from approvals.audit import chain
from approvals.core.errors import ConflictError, DomainError, NotFoundError
from approvals.models import ApproverGroup, Membership, Role, Tenant

MAX_SLUG_CHARS = Tenant._meta.get_field("slug").max_length
MAX_NAME_CHARS = Tenant._meta.get_field("name").max_length
ROLES: tuple[str, ...] = tuple(Role.values)


class TenancyError(DomainError):
    """A tenant or membership change refused for its input; nothing was written."""


class UnknownUserError(NotFoundError):
    """No user has that name."""


class NotAMemberError(NotFoundError):
    """The user is not a member of the tenant."""


class TenancyConflictError(ConflictError):
    """The tenant's members do not allow the change now (already a member, its last admin)."""


@dataclass(frozen=True)
class RoleChange:
    membership: Membership
    # The role before the change; equal to membership.role when nothing changed.
    previous: str

    @property
    def changed(self) -> bool:
        return self.previous != self.membership.role


def _article(role: str) -> str:
    return f"an {role}" if role[:1] in "aeiou" else f"a {role}"


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise TenancyError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")


def _lock(tenant: Tenant) -> None:
    Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)


def _is_last_admin(membership: Membership) -> bool:
    return (
        membership.role == Role.ADMIN
        and not Membership.objects.filter(tenant_id=membership.tenant_id, role=Role.ADMIN)
        .exclude(pk=membership.pk)
        .exists()
    )


def _sign_out_on_commit(*, tenant: Tenant, user, reason: str, actor) -> None:
    # After commit, in its own transaction: ending the sessions audits in each of the user's
    # tenants, and locking those under this tenant's lock could deadlock with another change.
    transaction.on_commit(
        lambda: signins.end_sessions(user=user, reason=reason, actor=actor, tenant=tenant),
        robust=True,
    )


def _locked_membership(tenant: Tenant, user) -> Membership:
    membership = (
        Membership.objects.select_for_update().filter(tenant=tenant, user=user).first()
        if user is not None
        else None
    )
    if membership is None:
        name = user.get_username() if user is not None else "nobody"
        raise NotAMemberError(f"user {name} is not a member of {tenant.slug}")
    return membership


def find_user(*, name_or_email: str):
    """The existing user with this username, or else with this email (for adding a member).

    Side effects: none.
    Raises:
        TenancyError: nothing given, or several users share the email (give the username).
        UnknownUserError: no user has that username or email.
    """
    name_or_email = (name_or_email or "").strip()
    if not name_or_email:
        raise TenancyError("give the user's name or email")
    users = get_user_model()
    user = users.objects.filter(username=name_or_email).first()
    if user is not None:
        return user
    if "@" in name_or_email:
        matches = list(users.objects.filter(email__iexact=name_or_email)[:2])
        if len(matches) > 1:
            raise TenancyError(f"several users have the email {name_or_email}: give the username")
        if matches:
            return matches[0]
    raise UnknownUserError(
        f"no user named {name_or_email!r}: invite them by email to let them make an account"
    )


def create_tenant(*, slug: str, name: str, actor=None, channel: str = "console") -> Tenant:
    """Create a tenant with no members yet (add its first admin with add_member).

    Side effects: the Tenant row and the first event of its audit chain, tenant.created
    (detail: slug, name, channel), in one transaction.
    Raises:
        TenancyError: a slug that is empty, too long or not letters, digits, hyphens and
            underscores; an empty or too long name.
        TenancyConflictError: a tenant with that slug exists.
    """
    slug, name = (slug or "").strip(), (name or "").strip()
    if not slug:
        raise TenancyError("give the tenant a slug")
    if len(slug) > MAX_SLUG_CHARS:
        raise TenancyError(f"the slug is {len(slug)} characters; at most {MAX_SLUG_CHARS}")
    try:
        validate_slug(slug)
    except ValidationError:
        raise TenancyError(
            f"the slug {slug!r} may hold only letters, digits, hyphens and underscores"
        ) from None
    if not name:
        raise TenancyError("give the tenant a name")
    if len(name) > MAX_NAME_CHARS:
        raise TenancyError(f"the name is {len(name)} characters; at most {MAX_NAME_CHARS}")
    try:
        with transaction.atomic():
            tenant = Tenant.objects.create(slug=slug, name=name)
            chain.append(
                tenant_id=tenant.pk,
                action="tenant.created",
                actor=actor,
                outcome="created",
                detail={"slug": slug, "name": name, "via": channel},
            )
    except IntegrityError:
        raise TenancyConflictError(f"a tenant {slug!r} already exists") from None
    return tenant


def add_member(
    *,
    tenant: Tenant,
    username: str,
    role: str,
    email: str = "",
    create_user: bool = False,
    password: str | None = None,
    actor=None,
    channel: str = "console",
) -> Membership:
    """Make the user called username a member of the tenant with this role.

    With create_user, the user is created first (with the email, and the password when one is
    given, checked by the project's password validators; without one, the user cannot sign in
    and acts only through API tokens bound to them). Without it, the user must exist; an email
    given is then stored as theirs.

    Side effects: the user (created, or their email set), the Membership row and an audit
    event member.added (detail: user, role, created user or not, channel), in one transaction
    under the tenant's lock; after commit the user's open sockets start hearing the tenant.
    Raises:
        TenancyError: an unknown role, a bad email, an empty username, or a password the
            validators refuse.
        UnknownUserError: no user has the name and create_user is false.
        TenancyConflictError: create_user for a name that is taken, or the user is already a
            member of the tenant.
    """
    _check_role(role)
    username = (username or "").strip()
    if not username:
        raise TenancyError("give the user's name")
    email = (email or "").strip()
    if email:
        try:
            validate_email(email)
        except ValidationError:
            raise TenancyError(f"{email!r} is not an email address") from None
    users = get_user_model()
    with transaction.atomic():
        _lock(tenant)
        user = users.objects.filter(username=username).first()
        if create_user:
            if user is not None:
                raise TenancyConflictError(f"a user named {username!r} already exists")
            user = users(username=username, email=email)
            if password:
                try:
                    password_validation.validate_password(password, user)
                except ValidationError as error:
                    raise TenancyError(
                        "the password is refused: " + " ".join(error.messages)
                    ) from None
                user.set_password(password)
            else:
                user.set_unusable_password()
            user.save()
        elif user is None:
            raise UnknownUserError(f"no user named {username!r}")
        elif email and user.email != email:
            user.email = email
            user.save(update_fields=["email"])
        existing = Membership.objects.filter(tenant=tenant, user=user).first()
        if existing is not None:
            raise TenancyConflictError(
                f"user {username} is already {_article(existing.role)} of {tenant.slug}"
            )
        membership = Membership.objects.create(tenant=tenant, user=user, role=role)
        chain.append(
            tenant_id=tenant.pk,
            action="member.added",
            actor=actor,
            outcome="added",
            detail={
                "user": username,
                "role": role,
                "created_user": create_user,
                "via": channel,
            },
        )
    return membership


def remove_member(*, tenant: Tenant, user, actor=None, channel: str = "console") -> None:
    """Remove the user from the tenant: their membership and their places in its approver
    groups. Their API tokens of the tenant stop authenticating (a token's person must be a
    member), and decisions they made stay as they were.

    Side effects: deletes the Membership, removes the user from the tenant's ApproverGroups,
    and appends an audit event member.removed (detail: user, role, groups, channel), in one
    transaction under the tenant's lock; after commit the user's open sockets stop hearing the
    tenant (approvals.live.memberships), and the user is signed out everywhere
    (signins.end_sessions, reason "removed from <slug>").
    Raises:
        NotAMemberError: the user is not a member of the tenant.
        TenancyConflictError: the user is the tenant's last admin.
    """
    with transaction.atomic():
        _lock(tenant)
        membership = _locked_membership(tenant, user)
        if _is_last_admin(membership):
            raise TenancyConflictError(
                f"user {user.get_username()} is the last admin of {tenant.slug}: make another "
                "member admin first"
            )
        groups = list(
            ApproverGroup.objects.filter(tenant=tenant, members=user)
            .order_by("name")
            .values_list("name", flat=True)
        )
        for group in ApproverGroup.objects.filter(tenant=tenant, members=user):
            group.members.remove(user)
        membership.delete()
        chain.append(
            tenant_id=tenant.pk,
            action="member.removed",
            actor=actor,
            outcome="removed",
            detail={
                "user": user.get_username(),
                "role": membership.role,
                "groups": groups,
                "via": channel,
            },
        )
        _sign_out_on_commit(
            tenant=tenant, user=user, reason=f"removed from {tenant.slug}", actor=actor
        )


def set_role(
    *, tenant: Tenant, user, role: str, actor=None, channel: str = "console"
) -> RoleChange:
    """Give a member of the tenant another role. The same role again changes nothing.

    Side effects: the Membership's role and an audit event member.role_changed (detail: user,
    from, to, channel), in one transaction under the tenant's lock; after commit the user's
    open sockets re-read what they may hear, and the user is signed out everywhere
    (signins.end_sessions, reason "role changed in <slug>"). Nothing is written when the role
    is the same.
    Raises:
        TenancyError: an unknown role.
        NotAMemberError: the user is not a member of the tenant.
        TenancyConflictError: the user is the tenant's last admin and the role is not admin.
    """
    _check_role(role)
    with transaction.atomic():
        _lock(tenant)
        membership = _locked_membership(tenant, user)
        previous = membership.role
        if previous == role:
            return RoleChange(membership, previous)
        if _is_last_admin(membership):
            raise TenancyConflictError(
                f"user {user.get_username()} is the last admin of {tenant.slug}: make another "
                "member admin first"
            )
        membership.role = role
        membership.save(update_fields=["role"])
        chain.append(
            tenant_id=tenant.pk,
            action="member.role_changed",
            actor=actor,
            outcome="changed",
            detail={"user": user.get_username(), "from": previous, "to": role, "via": channel},
        )
        _sign_out_on_commit(
            tenant=tenant, user=user, reason=f"role changed in {tenant.slug}", actor=actor
        )
    return RoleChange(membership, previous)


def set_sign_in_settings(
    *, tenant: Tenant, deciders_need_two_factor: bool, actor=None, channel: str = "console"
) -> list[str]:
    """The tenant's sign-in settings kept in approvals: whether deciders must have two-factor
    (the rule itself is approvals.decisions'). Returns the changes, empty when none.

    Side effects: the Tenant's field and an audit event auth.settings_changed (detail: changes,
    channel), in one transaction under the tenant's lock; nothing when unchanged.
    """
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if locked.deciders_need_two_factor == deciders_need_two_factor:
            return []
        locked.deciders_need_two_factor = deciders_need_two_factor
        locked.save(update_fields=["deciders_need_two_factor"])
        tenant.deciders_need_two_factor = deciders_need_two_factor
        changes = [f"deciders need two-factor {'on' if deciders_need_two_factor else 'off'}"]
        chain.append(
            tenant_id=tenant.pk,
            action="auth.settings_changed",
            actor=actor,
            outcome="changed",
            detail={"changes": ", ".join(changes), "via": channel},
        )
    return changes
