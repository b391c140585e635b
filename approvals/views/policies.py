"""The admins' pages for approval policies and approver groups. Anyone else gets 404."""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals.execution import registry
from approvals.forms.policies import GroupForm, PolicyForm
from approvals.models import (
    DECIDING_ROLES,
    ApprovalPolicy,
    ApproverGroup,
    Membership,
    Tenant,
)
from approvals.policies import scopes, versions
from approvals.policies.groups import delete_group, save_group
from approvals.views import access

HISTORY_LENGTH = 50


def _get_admin_tenant(request: HttpRequest, slug: str) -> Tenant:
    """The tenant named (or the active one, or the first) if the user is its admin; else 404."""
    admin_of = {m.tenant.slug: m.tenant for m in access.memberships(request).values() if m.is_admin}
    slug = slug or access.active_tenant(request)
    if not slug and admin_of:
        slug = sorted(admin_of)[0]
    tenant = admin_of.get(slug)
    if tenant is None:
        raise Http404("No such page.")
    return tenant


def _group_names(tenant: Tenant) -> list[str]:
    return list(ApproverGroup.objects.filter(tenant=tenant).values_list("name", flat=True))


def _admin_tenants(request: HttpRequest) -> list[Tenant]:
    return sorted(
        (m.tenant for m in access.memberships(request).values() if m.is_admin),
        key=lambda t: t.slug,
    )


def _policies_url(tenant: Tenant) -> str:
    return f"{reverse('approvals:policies')}?tenant={tenant.slug}"


@login_required
@require_GET
def policy_list(request: HttpRequest) -> HttpResponse:
    tenant = _get_admin_tenant(request, request.GET.get("tenant", ""))
    current = scopes.current_policies(tenant.pk)
    return render(
        request,
        "approvals/policies.html",
        {
            "tenant": tenant,
            "tenants": _admin_tenants(request),
            "current": current,
            "has_default": any(not (p.agent_key or p.tool_name) for p in current),
            "builtin": scopes.builtin_policy(tenant.pk),
            "groups": ApproverGroup.objects.filter(tenant=tenant).prefetch_related("members"),
            "agents": sorted(settings.APPROVALS_AGENTS),
            "tools": registry.tool_names(),
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def policy_edit(request: HttpRequest) -> HttpResponse:
    data = request.POST if request.method == "POST" else request.GET
    tenant = _get_admin_tenant(request, data.get("tenant", ""))
    groups = _group_names(tenant)
    agent_key, tool_name = data.get("agent", ""), data.get("tool", "")
    form = PolicyForm(request.POST if request.method == "POST" else None, groups=groups)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            agent_key, tool_name = form.cleaned_data["agent"], form.cleaned_data["tool"]
            try:
                policy = versions.save_policy(
                    tenant=tenant,
                    user=request.user,
                    agent_key=agent_key,
                    tool_name=tool_name,
                    **form.policy_values(),
                )
            except versions.PolicyUnchanged as unchanged:
                messages.info(request, unchanged.sentence())
                return redirect(_edit_url(tenant, agent_key, tool_name))
            except versions.PolicyError as error:
                form.add_error(None, error.sentence())
            else:
                messages.success(
                    request,
                    f"Saved {policy.scope_label} v{policy.version}. Pending tickets it governs "
                    "now follow it; approvals given under the previous version count no more.",
                )
                return redirect(_edit_url(tenant, agent_key, tool_name))
        status = 400
    else:
        current = scopes.current_for_scope(tenant.pk, agent_key, tool_name)
        base = current or scopes.resolve(tenant.pk, agent_key, tool_name)
        initial = PolicyForm.initial_from(base, tenant.slug)
        initial.update(agent=agent_key, tool=tool_name)
        form = PolicyForm(initial=initial, groups=groups)
        if agent_key not in dict(form.fields["agent"].choices) or tool_name not in dict(
            form.fields["tool"].choices
        ):
            raise Http404("No such agent or tool.")
    history = list(
        ApprovalPolicy.objects.filter(tenant=tenant, agent_key=agent_key, tool_name=tool_name)
        .select_related("created_by")
        .order_by("-version")[:HISTORY_LENGTH]
    )
    in_force = history[0] if history and not history[0].retired else None
    return render(
        request,
        "approvals/policy_edit.html",
        {
            "tenant": tenant,
            "form": form,
            "scope": ApprovalPolicy(agent_key=agent_key, tool_name=tool_name).scope_label,
            "history": history,
            "in_force": in_force,
            "agent_key": agent_key,
            "tool_name": tool_name,
            "groups": groups,
        },
        status=status,
    )


@login_required
@require_POST
def policy_remove(request: HttpRequest) -> HttpResponse:
    tenant = _get_admin_tenant(request, request.POST.get("tenant", ""))
    agent_key, tool_name = request.POST.get("agent", ""), request.POST.get("tool", "")
    if (agent_key and agent_key not in settings.APPROVALS_AGENTS) or (
        tool_name and tool_name not in registry.tool_names()
    ):
        raise Http404("No such agent or tool.")
    try:
        removed = versions.remove_policy(
            tenant=tenant, user=request.user, agent_key=agent_key, tool_name=tool_name
        )
    except versions.PolicyError as error:
        messages.error(request, f"Not removed: {error}.")
    else:
        now = scopes.resolve(tenant.pk, agent_key, tool_name)
        messages.success(
            request,
            f"Removed the policy for {removed.scope_label}. Its pending tickets now follow "
            f"{_label(now)}; approvals given under the removed one count no more.",
        )
    return redirect(_edit_url(tenant, agent_key, tool_name))


def _label(policy: ApprovalPolicy) -> str:
    if policy.is_builtin:
        return "the built-in default (one approval by anyone who may decide)"
    return f"{policy.scope_label} v{policy.version}"


def _edit_url(tenant: Tenant, agent_key: str, tool_name: str) -> str:
    query = urlencode({"tenant": tenant.slug, "agent": agent_key, "tool": tool_name})
    return f"{reverse('approvals:policy-edit')}?{query}"


@login_required
@require_http_methods(["GET", "POST"])
def group_edit(request: HttpRequest) -> HttpResponse:
    data = request.POST if request.method == "POST" else request.GET
    tenant = _get_admin_tenant(request, data.get("tenant", ""))
    # Only people who may decide can count as a group's approvals.
    usernames = sorted(
        Membership.objects.filter(tenant=tenant, role__in=DECIDING_ROLES).values_list(
            "user__username", flat=True
        )
    )
    status = 200
    if request.method == "POST":
        form = GroupForm(request.POST, usernames=usernames)
        if form.is_valid():
            members = get_user_model().objects.filter(username__in=form.cleaned_data["members"])
            try:
                group = save_group(
                    tenant=tenant,
                    user=request.user,
                    name=form.cleaned_data["name"],
                    members=list(members),
                )
            except versions.PolicyError as error:
                form.add_error(None, error.sentence())
            else:
                messages.success(request, f"Saved the group {group.name}.")
                return redirect(f"{reverse('approvals:groups')}?tenant={tenant.slug}")
        status = 400
    else:
        name = request.GET.get("name", "")
        existing = ApproverGroup.objects.filter(tenant=tenant, name=name).first()
        form = GroupForm(
            initial={
                "tenant": tenant.slug,
                "name": name,
                "members": (
                    list(existing.members.values_list("username", flat=True)) if existing else []
                ),
            },
            usernames=usernames,
        )
    groups = ApproverGroup.objects.filter(tenant=tenant).prefetch_related("members")
    editing = next((g for g in groups if g.name == form["name"].value()), None)
    return render(
        request,
        "approvals/groups.html",
        {
            "tenant": tenant,
            "form": form,
            "groups": groups,
            "editing": editing,
            "policies_url": _policies_url(tenant),
        },
        status=status,
    )


@login_required
@require_POST
def group_delete(request: HttpRequest) -> HttpResponse:
    tenant = _get_admin_tenant(request, request.POST.get("tenant", ""))
    name = request.POST.get("name", "")
    groups_url = f"{reverse('approvals:groups')}?tenant={tenant.slug}"
    try:
        delete_group(tenant=tenant, user=request.user, name=name)
    except versions.PolicyError as error:
        messages.error(request, f"Not deleted: {error}.")
        if "\x00" in name:
            return redirect(groups_url)
        return redirect(f"{groups_url}&{urlencode({'name': name})}")
    messages.success(request, f"Deleted the group {name}.")
    return redirect(groups_url)
