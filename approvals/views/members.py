"""The Team pages: a tenant's members and invitations (its admins only; anyone else gets 404),
the invitation link (anyone holding it), and a user's own page of tenants and roles."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals import invitations, tenancy
from approvals.core.errors import DomainError
from approvals.decisions import factors
from approvals.forms.members import AcceptForm, AddMemberForm, InviteForm, RoleForm
from approvals.models import ApproverGroup, Membership, Role, Tenant
from approvals.views import access, errors


def _members_url(tenant: Tenant) -> str:
    return f"{reverse('approvals:members')}?tenant={tenant.slug}"


def _groups_by_user(tenant: Tenant) -> dict[int, list[str]]:
    groups: dict[int, list[str]] = {}
    for name, user_id in (
        ApproverGroup.objects.filter(tenant=tenant, members__isnull=False)
        .order_by("name")
        .values_list("name", "members")
    ):
        groups.setdefault(user_id, []).append(name)
    return groups


def _member_of(tenant: Tenant, user_id: int) -> Membership:
    membership = (
        Membership.objects.filter(tenant=tenant, user_id=user_id).select_related("user").first()
    )
    if membership is None:
        raise Http404("No such member.")
    return membership


def _page(
    request: HttpRequest,
    tenant: Tenant,
    *,
    add_form: AddMemberForm | None = None,
    invite_form: InviteForm | None = None,
    status: int = 200,
    **extra: object,
) -> HttpResponse:
    members = list(
        Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")
    )
    groups = _groups_by_user(tenant)
    rows = [(m, groups.get(m.user_id, [])) for m in members]
    initial = {"tenant": tenant.slug}
    return render(
        request,
        "approvals/members.html",
        {
            "tenant": tenant,
            "tenants": sorted(access.admin_tenants(request).values(), key=lambda t: t.slug),
            "rows": rows,
            "admins": sum(1 for m in members if m.role == Role.ADMIN),
            "roles": Role.choices,
            "invitations": invitations.pending(tenant),
            "add_form": add_form or AddMemberForm(initial=initial),
            "invite_form": invite_form or InviteForm(initial=initial),
            **extra,
        },
        status=status,
    )


@never_cache
@login_required
@require_GET
def member_list(request: HttpRequest) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.GET.get("tenant", ""))
    return _page(request, tenant)


@login_required
@require_POST
def member_add(request: HttpRequest) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.POST.get("tenant", ""))
    form = AddMemberForm(request.POST)
    if form.is_valid():
        try:
            user = tenancy.find_user(name_or_email=form.cleaned_data["user"])
            membership = tenancy.add_member(
                tenant=tenant,
                username=user.get_username(),
                role=form.cleaned_data["role"],
                actor=request.user,
            )
        except tenancy.UnknownUserError as error:
            # Not a 404 page: the admin mistyped a name, the form says so.
            form.add_error("user", error.sentence())
        except DomainError as error:
            form.add_error("user", errors.explain(error)[0])
        else:
            messages.success(
                request,
                f"Added {membership.user.get_username()} to {tenant.name} as "
                f"{membership.get_role_display().lower()}.",
            )
            return redirect(_members_url(tenant))
    return _page(request, tenant, add_form=form, status=400)


@login_required
@require_POST
def member_role(request: HttpRequest, user_id: int) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.POST.get("tenant", ""))
    membership = _member_of(tenant, user_id)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the roles.")
        return redirect(_members_url(tenant))
    name = membership.user.get_username()
    try:
        change = tenancy.set_role(
            tenant=tenant, user=membership.user, role=form.cleaned_data["role"], actor=request.user
        )
    except DomainError as error:
        messages.error(request, f"Not changed: {errors.explain(error)[0]}")
    else:
        if change.changed:
            messages.success(
                request, f"{name} is now {change.membership.get_role_display().lower()}."
            )
        else:
            messages.info(request, f"{name} is {change.previous} already: nothing changed.")
    return redirect(_members_url(tenant))


@login_required
@require_http_methods(["GET", "POST"])
def member_remove(request: HttpRequest, user_id: int) -> HttpResponse:
    data = request.POST if request.method == "POST" else request.GET
    tenant = access.get_admin_tenant(request, data.get("tenant", ""))
    membership = _member_of(tenant, user_id)
    context = {
        "tenant": tenant,
        "membership": membership,
        "groups": _groups_by_user(tenant).get(membership.user_id, []),
        "members_url": _members_url(tenant),
    }
    if request.method == "GET":
        return render(request, "approvals/member_remove.html", context)
    name = membership.user.get_username()
    try:
        tenancy.remove_member(tenant=tenant, user=membership.user, actor=request.user)
    except DomainError as error:
        context["problem"] = errors.explain(error)[0]
        return render(request, "approvals/member_remove.html", context, status=409)
    messages.success(request, f"Removed {name} from {tenant.name}.")
    return redirect(_members_url(tenant))


@login_required
@require_POST
def invite(request: HttpRequest) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.POST.get("tenant", ""))
    form = InviteForm(request.POST)
    if form.is_valid():
        try:
            sent = invitations.invite(
                tenant=tenant,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
                actor=request.user,
            )
        except DomainError as error:
            form.add_error("email", errors.explain(error)[0])
        else:
            if sent.emailed:
                messages.success(
                    request,
                    f"Invited {sent.invitation.email} as {sent.invitation.role}: the email's "
                    "link works once, for 7 days.",
                )
                return redirect(_members_url(tenant))
            # Shown in this response only: the link is stored as its hash.
            return _page(request, tenant, unsent=sent, status=201)
    return _page(request, tenant, invite_form=form, status=400)


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.POST.get("tenant", ""))
    try:
        invitation = invitations.revoke(tenant=tenant, pk=pk, actor=request.user)
    except DomainError as error:
        messages.error(request, f"Not revoked: {errors.explain(error)[0]}")
    else:
        messages.success(
            request, f"Revoked the invitation of {invitation.email}: its link no longer works."
        )
    return redirect(_members_url(tenant))


@never_cache
@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    try:
        invitation = invitations.open_invitation(token=token)
    except (invitations.InvitationNotValidError, invitations.InvitationClosedError) as error:
        return render(
            request,
            "approvals/invitation.html",
            {"problem": error.sentence()},
            status=error.status,
        )
    signed_in = request.user.is_authenticated
    form = AcceptForm(request.POST if request.method == "POST" and not signed_in else None)
    context = {"invitation": invitation, "form": form, "signed_in": signed_in, "token": token}
    if request.method == "GET":
        return render(request, "approvals/invitation.html", context)
    if signed_in or form.is_valid():
        try:
            membership = invitations.accept(
                token=token,
                user=request.user if signed_in else None,
                username="" if signed_in else form.cleaned_data["username"],
                password="" if signed_in else form.cleaned_data["password"],
            )
        except (invitations.InvitationNotValidError, invitations.InvitationClosedError) as error:
            return render(
                request,
                "approvals/invitation.html",
                {"problem": error.sentence()},
                status=error.status,
            )
        except DomainError as error:
            message = error.sentence()
            if signed_in:
                context["problem"] = message
            else:
                field = "password" if "password" in message.lower() else "username"
                form.add_error(field, message)
        else:
            if not signed_in:
                login(
                    request,
                    membership.user,
                    backend="django.contrib.auth.backends.ModelBackend",
                )
            messages.success(
                request,
                f"Welcome to {invitation.tenant.name}: you are "
                f"{membership.get_role_display().lower()}.",
            )
            return redirect("approvals:me")
    return render(request, "approvals/invitation.html", context, status=400)


@login_required
@require_GET
def me(request: HttpRequest) -> HttpResponse:
    memberships = sorted(access.memberships(request).values(), key=lambda m: m.tenant.slug)
    groups: dict[int, list[str]] = {}
    for tenant_id, name in (
        ApproverGroup.objects.filter(members=request.user)
        .order_by("name")
        .values_list("tenant_id", "name")
    ):
        groups.setdefault(tenant_id, []).append(name)
    return render(
        request,
        "approvals/me.html",
        {
            "rows": [(m, groups.get(m.tenant_id, [])) for m in memberships],
            "factors": factors.factors_of(request.user),
            "two_factor_tenants": [
                m.tenant.name for m in memberships if m.tenant.deciders_need_two_factor
            ],
        },
    )
