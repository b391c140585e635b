"""Invitations by email: an admin invites an address with a role; the link in the email makes
whoever opens it (a new user, or one signed in) a member with that role, once, within 7 days.

The link carries a random token; the row keeps only its SHA-256, so the database cannot sign
anyone in. A token that matches no row (mistyped, cut short, made up) is refused as not valid;
an expired, used or revoked one says which. The membership itself is made by
approvals.tenancy.add_member, so an invitation refuses what adding a member refuses.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import smtplib
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import QuerySet
from django.template.loader import render_to_string
from django.utils import timezone

from approvals import tenancy
from approvals.audit import chain
from approvals.core.errors import ConflictError, DomainError, NotFoundError
from approvals.core.links import public_url
from approvals.models import Invitation, Membership, Tenant

VALID_FOR = timedelta(days=7)
logger = logging.getLogger("approvals.invitations")


class InvitationError(DomainError):
    """An invitation refused for its input; nothing was written."""


class InvitationNotValidError(NotFoundError):
    """The link's token matches no invitation (mistyped, cut short or made up)."""


class InvitationClosedError(ConflictError):
    """The invitation was used, revoked or has expired."""

    status = 410


@dataclass(frozen=True)
class Sent:
    invitation: Invitation
    # The link, shown to the admin only when the email could not be sent.
    link: str
    emailed: bool


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def pending(tenant: Tenant) -> QuerySet[Invitation]:
    """The tenant's invitations that can still be accepted, newest first."""
    return Invitation.objects.filter(
        tenant=tenant, accepted_at=None, revoked_at=None, expires_at__gt=timezone.now()
    ).select_related("invited_by")


def invite(*, tenant: Tenant, email: str, role: str, actor, channel: str = "console") -> Sent:
    """Invite an email address to become a member of the tenant with this role.

    Side effects: an Invitation row (the token's hash, expiring in 7 days) and an audit event
    invitation.sent (detail: email, role, expiry, channel), in one transaction; then one email
    with the link, through Django's mail backend. An email that cannot be sent leaves the
    invitation in place (emailed=False, the link returned for the admin to pass on).
    Raises:
        InvitationError: a bad email address or an unknown role.
        tenancy.TenancyConflictError: a member of the tenant already has that email, or the
            address has an invitation of the tenant pending (revoke it first).
    """
    email = (email or "").strip()
    try:
        validate_email(email)
    except ValidationError:
        raise InvitationError(f"{email!r} is not an email address") from None
    if role not in tenancy.ROLES:
        raise InvitationError(f"unknown role {role!r}; the roles are {', '.join(tenancy.ROLES)}")
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        if Membership.objects.filter(tenant=tenant, user__email__iexact=email).exists():
            raise tenancy.TenancyConflictError(
                f"a member of {tenant.slug} already has the email {email}"
            )
        if pending(tenant).filter(email__iexact=email).exists():
            raise tenancy.TenancyConflictError(
                f"{email} already has an invitation pending: revoke it to send a new one"
            )
        invitation = Invitation.objects.create(
            tenant=tenant,
            email=email,
            role=role,
            token_hash=_hash(token),
            invited_by=actor,
            created_at=now,
            expires_at=now + VALID_FOR,
        )
        chain.append(
            tenant_id=tenant.pk,
            action="invitation.sent",
            actor=actor,
            outcome="sent",
            detail={
                "email": email,
                "role": role,
                "expires": invitation.expires_at.isoformat(),
                "via": channel,
            },
        )
    link = public_url("approvals:invitation", token)
    context = {"invitation": invitation, "link": link, "inviter": actor.get_username()}
    try:
        send_mail(
            f"[{tenant.name}] You are invited to the approval console",
            render_to_string("approvals/invitation_email.txt", context),
            settings.DEFAULT_FROM_EMAIL,
            [email],
        )
    except (smtplib.SMTPException, OSError) as error:
        logger.warning("invitation %s: the email was not sent: %s", invitation.pk, error)
        return Sent(invitation, link, emailed=False)
    return Sent(invitation, link, emailed=True)


def _closed_reason(invitation: Invitation) -> str:
    if invitation.accepted_at is not None:
        return (
            "this invitation was already used: sign in with the account made with it, or ask "
            f"an admin of {invitation.tenant.name} for a new invitation"
        )
    if invitation.revoked_at is not None:
        return (
            f"this invitation was revoked by an admin of {invitation.tenant.name}: ask them "
            "for a new one if you still need access"
        )
    return (
        f"this invitation expired on {invitation.expires_at:%Y-%m-%d %H:%M} UTC: ask an admin "
        f"of {invitation.tenant.name} to invite you again"
    )


def open_invitation(*, token: str) -> Invitation:
    """The invitation the link's token belongs to, if it can still be accepted.

    Side effects: none.
    Raises:
        InvitationNotValidError: the token matches no invitation.
        InvitationClosedError: the invitation was used, revoked or has expired.
    """
    invitation = (
        Invitation.objects.filter(token_hash=_hash(token or "")).select_related("tenant").first()
    )
    if invitation is None:
        raise InvitationNotValidError(
            "this invitation link is not valid: it may be mistyped or cut short; open the link "
            "from the email again, or ask an admin for a new invitation"
        )
    if not invitation.is_pending:
        raise InvitationClosedError(_closed_reason(invitation))
    return invitation


def accept(
    *,
    token: str,
    user=None,
    username: str = "",
    password: str = "",
    channel: str = "invitation",
) -> Membership:
    """Accept the invitation: the signed-in user, or a new user with this username and
    password, becomes a member of its tenant with its role. A link works once.

    Side effects, in one transaction under the invitation row's lock: the user when new (with
    the invitation's email), the Membership and its audit event member.added (through
    tenancy.add_member), the invitation marked accepted and an audit event invitation.accepted
    (detail: email, role, user). channel names how it was accepted in member.added ("sso":
    after a single sign-on round trip, accounts.sso).
    Raises:
        InvitationNotValidError, InvitationClosedError: as open_invitation.
        InvitationError: a new user without a password.
        tenancy.TenancyError: an empty username, or a password the validators refuse.
        tenancy.TenancyConflictError: the username is taken, or the user is a member already.
    """
    if user is None and not password:
        raise InvitationError("choose a password")
    with transaction.atomic():
        invitation = open_invitation(token=token)
        # Two tabs accepting at once: the second waits here and then finds it used.
        invitation = (
            Invitation.objects.select_for_update().select_related("tenant").get(pk=invitation.pk)
        )
        if not invitation.is_pending:
            raise InvitationClosedError(_closed_reason(invitation))
        if user is not None:
            membership = tenancy.add_member(
                tenant=invitation.tenant,
                username=user.get_username(),
                role=invitation.role,
                actor=user,
                channel=channel,
            )
        else:
            membership = tenancy.add_member(
                tenant=invitation.tenant,
                username=username,
                role=invitation.role,
                email=invitation.email,
                create_user=True,
                password=password,
                channel="invitation",
            )
        invitation.accepted_at = timezone.now()
        invitation.accepted_by = membership.user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
        chain.append(
            tenant_id=invitation.tenant_id,
            action="invitation.accepted",
            actor=membership.user,
            outcome="accepted",
            detail={
                "email": invitation.email,
                "role": invitation.role,
                "user": membership.user.get_username(),
            },
        )
    return membership


def revoke(*, tenant: Tenant, pk: int, actor, channel: str = "console") -> Invitation:
    """Revoke a pending invitation of the tenant: its link stops working.

    Side effects: the invitation's revoked_at and an audit event invitation.revoked (detail:
    email, role, channel), in one transaction.
    Raises:
        NotFoundError: the tenant has no invitation with that id.
        InvitationClosedError: it was used, revoked or has expired already.
    """
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update()
            .select_related("tenant")
            .filter(tenant=tenant, pk=pk)
            .first()
        )
        if invitation is None:
            raise NotFoundError("no such invitation")
        if not invitation.is_pending:
            raise InvitationClosedError(
                f"the invitation of {invitation.email} is no longer pending"
            )
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        chain.append(
            tenant_id=tenant.pk,
            action="invitation.revoked",
            actor=actor,
            outcome="revoked",
            detail={"email": invitation.email, "role": invitation.role, "via": channel},
        )
    return invitation
