"""Single sign-on with OpenID Connect: who may sign up through a provider, the memberships its
groups give, and the tenants whose members must sign in through it.

Rules (the adapters in accounts.adapters, the Sign-in page and the tests all ask these functions):

- A new SSO account is made only for an invitation the person followed (they chose "Sign in
  with <provider>" on the invitation page: the token waits in their session) or for a group of
  the provider's groups claim that a tenant maps to a role (accounts.GroupRole). Anything else is
  refused with a page that says to ask an admin for an invitation, and nothing is created.
- An SSO account never takes over a local user with the same email or username: a new user is
  made (its username made unique, the email left off when another user has it). A local user is
  linked to a provider only when already linked.
- On every SSO sign-in the groups claim (provider setting "groups_claim", default "groups", read
  from the userinfo and the id token) is mapped through GroupRole: a missing membership is
  added, a membership the mapping gave follows the mapping's role, and is removed when none of
  its groups is left. A membership given by an invitation or an admin is never changed or
  removed by a mapping (no accounts.GroupGrant row). Several groups of one tenant: the highest
  role wins (admin, approver, auditor, viewer).
- A tenant with TenantSignOn(required=True) wants its members signed in through its provider: a
  password or passkey sign-in of such a member is refused (auth.sign_in_refused in the tenant).
  Django superusers are exempt: the break-glass account when the provider is down.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

from allauth.account.authentication import get_authentication_records
from allauth.account.internal.flows.login import AUTHENTICATION_METHODS_SESSION_KEY
from allauth.account.models import EmailAddress
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from accounts.models import GroupGrant, GroupRole, TenantSignOn
from approvals import invitations, signins, tenancy
from approvals.audit import chain
from approvals.core.errors import DomainError
from approvals.models import Invitation, Membership, Role, Tenant

logger = logging.getLogger("accounts.sso")

INVITATION_SESSION_KEY = "accounts_sso_invitation"
ROLE_RANK = {Role.VIEWER: 0, Role.AUDITOR: 1, Role.APPROVER: 2, Role.ADMIN: 3}
MAX_GROUP_CHARS = GroupRole._meta.get_field("group").max_length


class SignOnError(DomainError):
    """A sign-in setting or mapping refused for its input; nothing was written."""


class SignUpRefused(DomainError):
    """No invitation and no mapped group: the provider's person gets no account."""

    status = 403

    def __init__(self, message: str, *, tenant_ids: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.tenant_ids = tenant_ids


# --- providers ---------------------------------------------------------------------------------


def providers() -> list[dict]:
    """The configured OpenID Connect providers (settings.SOCIALACCOUNT_PROVIDERS, read at each
    call so tests and the environment may change them)."""
    conf = getattr(settings, "SOCIALACCOUNT_PROVIDERS", {}).get("openid_connect", {})
    return list(conf.get("APPS", []))


def provider(provider_id: str) -> dict | None:
    return next((p for p in providers() if p["provider_id"] == provider_id), None)


def provider_name(provider_id: str) -> str:
    found = provider(provider_id)
    return str(found.get("name") or provider_id) if found else provider_id


def groups_claim(provider_id: str) -> str:
    found = provider(provider_id) or {}
    return str((found.get("settings") or {}).get("groups_claim") or "groups")


def claims(extra_data: dict) -> dict:
    """The person's claims: the userinfo, completed by the id token (allauth keeps both)."""
    merged: dict = {}
    if isinstance(extra_data, dict):
        for part in ("id_token", "userinfo"):
            if isinstance(extra_data.get(part), dict):
                merged.update(extra_data[part])
        if not merged:
            merged = dict(extra_data)
    return merged


def groups_of(provider_id: str, extra_data: dict) -> list[str]:
    """The values of the provider's groups claim (a list, or one string), trimmed, no blanks."""
    value = claims(extra_data).get(groups_claim(provider_id))
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return []
    return sorted({str(v).strip() for v in value if str(v).strip()})


def mapped_roles(provider_id: str, groups: list[str]) -> dict[int, tuple[str, list[str]]]:
    """Tenant id -> (the highest role the groups are mapped to, the groups that gave it)."""
    found: dict[int, tuple[str, list[str]]] = {}
    for mapping in GroupRole.objects.filter(provider_id=provider_id, group__in=groups):
        role, given = found.get(mapping.tenant_id, (None, []))
        given = sorted({*given, mapping.group})
        if role is None or ROLE_RANK[Role(mapping.role)] > ROLE_RANK[Role(role)]:
            role = mapping.role
        found[mapping.tenant_id] = (role, given)
    return found


# --- the invitation an invitee follows through the provider ------------------------------------


def remember_invitation(request, token: str) -> Invitation:
    """Keep the invitation's token in the session for the SSO round trip that follows.

    Raises: as invitations.open_invitation (the link is not valid, used, revoked or expired).
    """
    invitation = invitations.open_invitation(token=token)
    request.session[INVITATION_SESSION_KEY] = token
    return invitation


def _pending_invitation(request) -> tuple[str, Invitation | None]:
    token = request.session.get(INVITATION_SESSION_KEY) or ""
    if not token:
        return "", None
    try:
        return token, invitations.open_invitation(token=token)
    except DomainError:
        return token, None


# --- sign-up -----------------------------------------------------------------------------------


def admit(request, *, provider_id: str, extra_data: dict) -> None:
    """May the provider's person, who has no account here yet, get one?

    Side effects: none when admitted; a refusal clears a pending invitation from the session and
    appends auth.sign_in_refused to each tenant the refusal is known for (the invitation's).
    Raises:
        SignUpRefused: no open invitation followed and no group mapped to a role.
    """
    token, invitation = _pending_invitation(request)
    if invitation is not None:
        return
    if mapped_roles(provider_id, groups_of(provider_id, extra_data)):
        return
    request.session.pop(INVITATION_SESSION_KEY, None)
    name = provider_name(provider_id)
    message = (
        f"There is no account here for you yet: signing in with {name} works once an admin of "
        "your team has invited you. Ask an admin for an invitation, then open its link and "
        f"choose “Sign in with {name}” there."
    )
    tenant_ids: tuple[int, ...] = ()
    if token:
        closed = Invitation.objects.filter(token_hash=invitations._hash(token)).first()
        if closed is not None:
            tenant_ids = (closed.tenant_id,)
            message = (
                f"The invitation you followed can no longer be used, so no account was made. "
                f"Ask an admin of {closed.tenant.name} for a new invitation."
            )
    who = _display_name(extra_data)
    for tenant_id in tenant_ids:
        with transaction.atomic():
            chain.append(
                tenant_id=tenant_id,
                action="auth.sign_in_refused",
                actor_name=who[:150],
                outcome="refused",
                detail={
                    "reason": "no account: the invitation can no longer be used",
                    "method": "sso",
                    "provider": provider_id,
                },
            )
    raise SignUpRefused(message, tenant_ids=tenant_ids)


def _display_name(extra_data: dict) -> str:
    data = claims(extra_data)
    return str(data.get("preferred_username") or data.get("email") or data.get("sub") or "?")


def unique_username(extra_data: dict) -> str:
    """A username for a new SSO user: preferred_username, else the email's local part, else
    "user"; letters, digits and @.+-_ only; a number added until no user has it."""
    data = claims(extra_data)
    base = str(data.get("preferred_username") or "").strip()
    if not base:
        base = str(data.get("email") or "").split("@")[0]
    base = re.sub(r"[^\w.@+-]", "", base)[:140] or "user"
    users = get_user_model()
    name, n = base, 1
    while users.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}{n}"
    return name


def email_is_free(email: str) -> bool:
    """No other user has this email (a new SSO user gets it only then: no confusion with, and no
    takeover of, an existing local user)."""
    if not email:
        return False
    users = get_user_model()
    return not (
        users.objects.filter(email__iexact=email).exists()
        or EmailAddress.objects.filter(email__iexact=email).exists()
    )


# --- after an SSO sign-in ----------------------------------------------------------------------


@dataclass(frozen=True)
class SignedIn:
    accepted: Membership | None
    added: list[str]
    changed: list[str]
    removed: list[str]


def signed_in_recently(request, user) -> bool:
    """The session signed in (or again) through a provider within the re-authentication window
    (ACCOUNT_REAUTHENTICATION_TIMEOUT seconds)."""
    records = get_authentication_records(request, user)
    last = max((r.get("at", 0) for r in records if r.get("method") == "socialaccount"), default=0)
    return time.time() - last < settings.ACCOUNT_REAUTHENTICATION_TIMEOUT


def signed_in(request, *, user, provider_id: str, extra_data: dict) -> SignedIn:
    """What an SSO sign-in does: the invitation followed is accepted for the account (channel
    "sso") and the groups claim is mapped to memberships (sync_groups). The sign-in itself is
    audited afterwards, in the tenants this gave (accounts.audit.record_sign_in).
    """
    accepted = None
    token, invitation = _pending_invitation(request)
    request.session.pop(INVITATION_SESSION_KEY, None)
    if invitation is not None:
        try:
            accepted = invitations.accept(token=token, user=user, channel="sso")
        except DomainError as error:
            logger.info("invitation not accepted for %s: %s", user.get_username(), error)
    synced = sync_groups(user=user, provider_id=provider_id, extra_data=extra_data)
    return SignedIn(accepted, *synced)


def sync_groups(*, user, provider_id: str, extra_data: dict) -> tuple[list, list, list]:
    """Memberships from the groups claim: add, change the role of, or remove (when its groups
    are gone) each membership a mapping gave; leave those given by invitation or admin.

    Side effects: through approvals.tenancy (channel "sso": member.added, member.role_changed,
    member.removed) and the GroupGrant rows. A change the tenant refuses (its last admin) is
    skipped and logged. Returns the tenant slugs added, changed and removed.
    """
    wanted = mapped_roles(provider_id, groups_of(provider_id, extra_data))
    added: list[str] = []
    changed: list[str] = []
    removed: list[str] = []
    grants = {g.tenant_id: g for g in GroupGrant.objects.filter(user=user)}
    tenants = Tenant.objects.in_bulk({*wanted, *grants})
    members = dict(
        Membership.objects.filter(user=user, tenant_id__in=tenants).values_list("tenant_id", "role")
    )
    for tenant_id, tenant in tenants.items():
        grant = grants.get(tenant_id)
        if grant is not None and tenant_id not in members:
            # Removed by an admin since: the mapping may give it again below.
            grant.delete()
            grant = None
        try:
            if tenant_id in wanted:
                role, groups = wanted[tenant_id]
                if tenant_id not in members:
                    with transaction.atomic():
                        tenancy.add_member(
                            tenant=tenant,
                            username=user.get_username(),
                            role=role,
                            channel="sso",
                        )
                        GroupGrant.objects.create(
                            tenant=tenant, user=user, provider_id=provider_id, groups=groups
                        )
                    added.append(tenant.slug)
                elif grant is not None and grant.provider_id == provider_id:
                    with transaction.atomic():
                        if tenancy.set_role(
                            tenant=tenant, user=user, role=role, channel="sso"
                        ).changed:
                            changed.append(tenant.slug)
                        grant.groups = groups
                        grant.save(update_fields=["groups"])
            elif grant is not None and grant.provider_id == provider_id:
                with transaction.atomic():
                    tenancy.remove_member(tenant=tenant, user=user, channel="sso")
                    grant.delete()
                removed.append(tenant.slug)
        except DomainError as error:
            logger.warning(
                "groups of %s not applied in %s: %s", user.get_username(), tenant.slug, error
            )
    return added, changed, removed


def required_providers(user) -> dict[Tenant, str]:
    """The tenants of the user that require SSO, each with its provider's id."""
    rows = TenantSignOn.objects.filter(
        required=True, tenant__memberships__user=user
    ).select_related("tenant")
    return {row.tenant: row.provider_id for row in rows}


def refuse_sign_in(*, user, provider_id: str | None, method: str) -> str:
    """Why this sign-in is refused ("" when it is not): the user is a member of a tenant that
    requires its provider, and signed in otherwise. Superusers are never refused (break-glass).

    Side effects: a refusal appends auth.sign_in_refused (reason, method, provider wanted) to
    each tenant whose rule refused it.
    """
    if user is None or user.is_superuser:
        return ""
    wrong = {t: p for t, p in required_providers(user).items() if p != provider_id}
    if not wrong:
        return ""
    names = sorted({provider_name(p) for p in wrong.values()})
    tenants = ", ".join(sorted(t.name for t in wrong))
    for tenant, wanted in wrong.items():
        with transaction.atomic():
            chain.append(
                tenant_id=tenant.pk,
                action="auth.sign_in_refused",
                actor=user,
                outcome="refused",
                detail={
                    "reason": f"{tenant.name} requires sign-in with {provider_name(wanted)}",
                    "method": method,
                    "provider": wanted,
                },
            )
    buttons = " or ".join(f"“Sign in with {name}”" for name in names)
    return f"{tenants} requires single sign-on: use {buttons} below instead of a {method}."


def sign_on_of(tenant: Tenant) -> TenantSignOn | None:
    return TenantSignOn.objects.filter(tenant=tenant).first()


def set_sign_on(
    *, tenant: Tenant, provider_id: str, required: bool, actor, keep_session_key: str | None = None
) -> list[str]:
    """Choose the tenant's provider ("" for none) and whether its members must use it.

    Side effects: the TenantSignOn row (deleted for no provider) and auth.settings_changed
    (changes) in one transaction; turning "required" on then ends every session of the tenant's
    members (but the actor's current one and the superusers') that was not signed in through
    the provider (approvals.signins.end_sessions, audited auth.sessions_ended). Returns the
    changes, empty when nothing changed.
    Raises:
        SignOnError: an unknown provider, or "required" without a provider.
    """
    provider_id = (provider_id or "").strip()
    if provider_id and provider(provider_id) is None:
        raise SignOnError(f"no single sign-on provider {provider_id!r} is configured")
    if required and not provider_id:
        raise SignOnError("choose the provider members must sign in with")
    with transaction.atomic():
        current = TenantSignOn.objects.select_for_update().filter(tenant=tenant).first()
        before = (current.provider_id, current.required) if current else ("", False)
        changes: list[str] = []
        if before[0] != provider_id:
            changes.append(f"provider {before[0] or 'none'} → {provider_id or 'none'}")
        if before[1] != required:
            changes.append(f"SSO required {'on' if required else 'off'}")
        if not changes:
            return []
        if not provider_id:
            if current:
                current.delete()
        else:
            TenantSignOn.objects.update_or_create(
                tenant=tenant,
                defaults={
                    "provider_id": provider_id,
                    "required": required,
                    "updated_at": timezone.now(),
                    "updated_by": actor,
                },
            )
        chain.append(
            tenant_id=tenant.pk,
            action="auth.settings_changed",
            actor=actor,
            outcome="changed",
            detail={"changes": ", ".join(changes), "provider": provider_id},
        )
    if required and (not before[1] or before[0] != provider_id):
        users = get_user_model().objects.filter(memberships__tenant=tenant, is_superuser=False)
        for user in users:
            signins.end_sessions(
                user=user,
                keep_session_key=keep_session_key,
                keep=lambda data: _signed_in_with(
                    data.get(AUTHENTICATION_METHODS_SESSION_KEY) or [], provider_id
                ),
                actor=actor,
                reason=f"{tenant.name} requires sign-in with {provider_name(provider_id)}",
                tenant=tenant,
            )
    return changes


def _signed_in_with(methods: list[dict], provider_id: str) -> bool:
    return any(
        m.get("method") == "socialaccount" and m.get("provider") == provider_id for m in methods
    )


def map_group(*, tenant: Tenant, provider_id: str, group: str, role: str, actor) -> GroupRole:
    """Map a group of the provider's groups claim to a role in the tenant (the next SSO
    sign-ins of its members apply it).

    Side effects: the GroupRole row and auth.sso_role_mapped (provider, group, role).
    Raises:
        SignOnError: an unknown provider or role, an empty or too long group, or the group
            mapped already (remove it first).
    """
    group = (group or "").strip()
    if provider(provider_id) is None:
        raise SignOnError(f"no single sign-on provider {provider_id!r} is configured")
    if not group:
        raise SignOnError("give the group's name as the provider sends it")
    if len(group) > MAX_GROUP_CHARS:
        raise SignOnError(f"a group name has at most {MAX_GROUP_CHARS} characters")
    if role not in tenancy.ROLES:
        raise SignOnError(f"unknown role {role!r}; the roles are {', '.join(tenancy.ROLES)}")
    with transaction.atomic():
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        existing = GroupRole.objects.filter(
            tenant=tenant, provider_id=provider_id, group=group
        ).first()
        if existing is not None:
            raise SignOnError(
                f"the group {group} is mapped to {existing.role} already: remove it first"
            )
        mapping = GroupRole.objects.create(
            tenant=tenant, provider_id=provider_id, group=group, role=role
        )
        chain.append(
            tenant_id=tenant.pk,
            action="auth.sso_role_mapped",
            actor=actor,
            outcome="mapped",
            detail={"provider": provider_id, "group": group, "role": role},
        )
    return mapping


def unmap_group(*, tenant: Tenant, pk: int, actor) -> GroupRole:
    """Remove a mapping of the tenant. Memberships it gave go at their next SSO sign-in.

    Side effects: deletes the GroupRole and appends auth.sso_role_unmapped.
    Raises:
        SignOnError: the tenant has no such mapping.
    """
    with transaction.atomic():
        mapping = GroupRole.objects.select_for_update().filter(tenant=tenant, pk=pk).first()
        if mapping is None:
            raise SignOnError("no such group mapping")
        mapping.delete()
        chain.append(
            tenant_id=tenant.pk,
            action="auth.sso_role_unmapped",
            actor=actor,
            outcome="unmapped",
            detail={"provider": mapping.provider_id, "group": mapping.group, "role": mapping.role},
        )
    return mapping
