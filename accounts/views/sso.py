"""The console's own pages of single sign-on: following an invitation through a provider, and a
tenant's Sign-in settings (its admins only)."""

from __future__ import annotations

from allauth.socialaccount.providers.openid_connect import views as oidc_views
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from accounts import sso
from accounts.forms import MappingForm, SignInForm
from accounts.models import GroupRole
from approvals import invitations, tenancy
from approvals.core.errors import DomainError
from approvals.models import Role, Tenant
from approvals.views import access


@require_POST
def invitation_sso(request: HttpRequest, provider_id: str) -> HttpResponse:
    """The invitation page's "Sign in with <provider>": keep the invitation for the round trip,
    then start the provider's sign-in (accounts.sso.signed_in accepts it on the way back)."""
    if sso.provider(provider_id) is None:
        raise Http404("No such single sign-on provider.")
    token = request.POST.get("token", "")
    try:
        sso.remember_invitation(request, token)
    except (invitations.InvitationNotValidError, invitations.InvitationClosedError) as error:
        return render(
            request, "approvals/invitation.html", {"problem": error.sentence()}, status=error.status
        )
    return oidc_views.login(request, provider_id)


def _url(tenant: Tenant) -> str:
    return f"{reverse('sign-in-settings')}?tenant={tenant.slug}"


def _page(
    request: HttpRequest,
    tenant: Tenant,
    *,
    form: SignInForm | None = None,
    mapping_form: MappingForm | None = None,
    status: int = 200,
) -> HttpResponse:
    sign_on = sso.sign_on_of(tenant)
    choices = [(p["provider_id"], p.get("name") or p["provider_id"]) for p in sso.providers()]
    initial = {
        "tenant": tenant.slug,
        "provider": sign_on.provider_id if sign_on else "",
        "required": bool(sign_on and sign_on.required),
        "deciders_need_two_factor": tenant.deciders_need_two_factor,
    }
    return render(
        request,
        "account/sign_in_settings.html",
        {
            "tenant": tenant,
            "tenants": sorted(access.admin_tenants(request).values(), key=lambda t: t.slug),
            "sign_on": sign_on,
            "providers": choices,
            "mappings": GroupRole.objects.filter(tenant=tenant),
            "names": dict(choices),
            "roles": Role.choices,
            "form": form or SignInForm(initial=initial, providers=choices),
            "mapping_form": mapping_form
            or MappingForm(initial={"tenant": tenant.slug}, providers=choices),
        },
        status=status,
    )


@never_cache
@login_required
@require_GET
def sign_in_settings(request: HttpRequest) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.GET.get("tenant", ""))
    return _page(request, tenant)


@login_required
@require_POST
def sign_in_save(request: HttpRequest) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.POST.get("tenant", ""))
    choices = [(p["provider_id"], p.get("name") or p["provider_id"]) for p in sso.providers()]
    form = SignInForm(request.POST, providers=choices)
    if not form.is_valid():
        return _page(request, tenant, form=form, status=400)
    try:
        changes = sso.set_sign_on(
            tenant=tenant,
            provider_id=form.cleaned_data["provider"],
            required=form.cleaned_data["required"],
            actor=request.user,
            keep_session_key=request.session.session_key,
        )
        changes += tenancy.set_sign_in_settings(
            tenant=tenant,
            deciders_need_two_factor=form.cleaned_data["deciders_need_two_factor"],
            actor=request.user,
        )
    except DomainError as error:
        form.add_error(None, error.sentence())
        return _page(request, tenant, form=form, status=400)
    if changes:
        messages.success(request, "Sign-in settings saved: " + "; ".join(changes) + ".")
    else:
        messages.info(request, "Nothing changed.")
    return redirect(_url(tenant))


@login_required
@require_POST
def mapping_add(request: HttpRequest) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.POST.get("tenant", ""))
    choices = [(p["provider_id"], p.get("name") or p["provider_id"]) for p in sso.providers()]
    form = MappingForm(request.POST, providers=choices)
    if form.is_valid():
        try:
            mapping = sso.map_group(
                tenant=tenant,
                provider_id=form.cleaned_data["provider"],
                group=form.cleaned_data["group"],
                role=form.cleaned_data["role"],
                actor=request.user,
            )
        except sso.SignOnError as error:
            form.add_error("group", error.sentence())
        else:
            messages.success(
                request,
                f"Members of the group {mapping.group} become {mapping.get_role_display().lower()}"
                " at their next single sign-on.",
            )
            return redirect(_url(tenant))
    return _page(request, tenant, mapping_form=form, status=400)


@login_required
@require_POST
def mapping_remove(request: HttpRequest) -> HttpResponse:
    tenant = access.get_admin_tenant(request, request.POST.get("tenant", ""))
    pk = request.POST.get("mapping", "")
    try:
        if not pk.isdigit():
            raise sso.SignOnError("no such group mapping")
        mapping = sso.unmap_group(tenant=tenant, pk=int(pk), actor=request.user)
    except sso.SignOnError as error:
        messages.error(request, f"Not removed: {error.sentence()}")
    else:
        messages.success(
            request,
            f"Removed the mapping of {mapping.group}: memberships it gave end at their next "
            "single sign-on.",
        )
    return redirect(_url(tenant))
