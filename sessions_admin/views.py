"""Sessions admin: list, read, clear and purge agent conversation sessions (admins only)."""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals.core import presenters
from approvals.models import Membership, Role, Tenant
from sessions_admin import services
from sessions_admin.stores import (
    Filters,
    SessionMissing,
    StoreUnavailable,
    configured_stores,
    get_store,
    list_sessions,
    parse_age,
)


def _admin_tenants(request: HttpRequest) -> dict[str, Tenant]:
    tenants = {
        m.tenant.slug: m.tenant
        for m in Membership.objects.filter(user=request.user, role=Role.ADMIN).select_related(
            "tenant"
        )
    }
    if not tenants:
        # Not an admin anywhere: the pages do not exist for this user.
        raise Http404("No such page.")
    return tenants


def _get_tenant_for_admin(request: HttpRequest, slug: str) -> Tenant:
    tenant = _admin_tenants(request).get(slug)
    if tenant is None:
        raise Http404("No such session.")
    return tenant


class SessionFilterForm(forms.Form):
    backend = forms.CharField(required=False, max_length=40)
    tenant = forms.CharField(required=False, max_length=64)
    prefix = forms.CharField(required=False, max_length=200)
    older_than = forms.CharField(required=False, max_length=10)

    def __init__(self, *args, tenants: dict[str, Tenant], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tenants = tenants
        self.store_names = [s.name for s in configured_stores()]

    def clean_backend(self) -> str:
        value = self.cleaned_data["backend"]
        if value and value not in self.store_names:
            raise forms.ValidationError(f"There is no store called {value!r} here.")
        return value

    def clean_tenant(self) -> str:
        value = self.cleaned_data["tenant"]
        if value and value not in self.tenants:
            raise forms.ValidationError(f"You are not an admin of a tenant called {value!r}.")
        return value

    def clean_older_than(self):
        value = self.cleaned_data["older_than"]
        if not value:
            return None
        try:
            return timezone.now() - parse_age(value)
        except ValueError as error:
            raise forms.ValidationError(str(error).capitalize() + ".") from None

    def filters(self) -> Filters:
        data = self.cleaned_data
        tenants = [self.tenants[data["tenant"]]] if data["tenant"] else list(self.tenants.values())
        return Filters(prefix=data["prefix"], older_than=data["older_than"], tenants=tenants)

    def store_list(self) -> list[str]:
        return [self.cleaned_data["backend"]] if self.cleaned_data["backend"] else self.store_names


def _form_problems(form: forms.Form) -> list[str]:
    return [m for errors in form.errors.values() for m in errors]


@login_required
@require_GET
def session_list(request: HttpRequest) -> HttpResponse:
    tenants = _admin_tenants(request)
    form = SessionFilterForm(request.GET, tenants=tenants)
    listing = None
    if form.is_valid():
        listing = list_sessions(form.filters(), [get_store(n) for n in form.store_list()])
    context = {
        "form": form,
        "listing": listing,
        "stores": configured_stores(),
        "tenants": sorted(tenants),
        "problems": _form_problems(form),
    }
    return render(request, "sessions_admin/list.html", context, status=200 if listing else 400)


def _session_id(request: HttpRequest) -> str:
    session_id = request.GET.get("id")
    if session_id is None or len(session_id) > 255:
        raise Http404("No such session.")
    return session_id


def _load(store_name: str, tenant: Tenant, session_id: str):
    try:
        store = get_store(store_name)
    except SessionMissing:
        raise Http404("No such store.") from None
    try:
        return store, store.items(tenant, session_id), ""
    except SessionMissing:
        raise Http404("No such session.") from None
    except StoreUnavailable as error:
        return store, None, str(error)


@login_required
@require_GET
def session_detail(request: HttpRequest, store: str, tenant: str) -> HttpResponse:
    tenant_row = _get_tenant_for_admin(request, tenant)
    session_id = _session_id(request)
    store_obj, items, problem = _load(store, tenant_row, session_id)
    context = {
        "store": store_obj,
        "tenant": tenant_row,
        "session_id": session_id,
        "entries": presenters.entries_from_items(items or []),
        "raw": json.dumps(items, indent=2, ensure_ascii=False) if items is not None else "",
        "count": len(items) if items is not None else None,
        "problem": problem,
    }
    return render(request, "sessions_admin/detail.html", context, status=503 if problem else 200)


@login_required
@require_http_methods(["GET", "POST"])
def session_clear(request: HttpRequest, store: str, tenant: str) -> HttpResponse:
    tenant_row = _get_tenant_for_admin(request, tenant)
    session_id = _session_id(request)
    store_obj, items, problem = _load(store, tenant_row, session_id)
    if request.method == "POST" and not problem:
        try:
            count = services.clear_session(
                store_name=store, tenant=tenant_row, session_id=session_id, actor=request.user
            )
        except SessionMissing:
            raise Http404("No such session.") from None
        except StoreUnavailable as error:
            problem = str(error)
        else:
            messages.success(
                request, f"Cleared {session_id} ({count} items). The clear is in the audit history."
            )
            return redirect("sessions_admin:list")
    context = {
        "store": store_obj,
        "tenant": tenant_row,
        "session_id": session_id,
        "count": len(items or []),
        "problem": problem,
    }
    return render(request, "sessions_admin/clear.html", context, status=503 if problem else 200)


@login_required
@require_GET
def purge_preview(request: HttpRequest) -> HttpResponse:
    tenants = _admin_tenants(request)
    form = SessionFilterForm(request.GET or None, tenants=tenants)
    plan = None
    problems: list[str] = []
    if form.is_bound:
        if (
            form.is_valid()
            and not form.cleaned_data["prefix"]
            and not form.cleaned_data["older_than"]
        ):
            problems.append("Give an id prefix or an age: a purge never takes every session.")
        elif form.is_valid():
            plan = services.plan_purge(store_names=form.store_list(), filters=form.filters())
        else:
            problems = _form_problems(form)
    context = {
        "form": form,
        "plan": plan,
        "problems": problems,
        "stores": configured_stores(),
        "tenants": sorted(tenants),
        "query": request.GET.urlencode(),
    }
    return render(request, "sessions_admin/purge.html", context, status=400 if problems else 200)


@login_required
@require_POST
def purge_confirm(request: HttpRequest) -> HttpResponse:
    tenants = _admin_tenants(request)
    form = SessionFilterForm(request.POST, tenants=tenants)
    typed = request.POST.get("confirm", "").strip()
    if not form.is_valid() or (
        not form.cleaned_data["prefix"] and not form.cleaned_data["older_than"]
    ):
        return render(
            request,
            "sessions_admin/purge.html",
            {
                "form": form,
                "plan": None,
                "problems": _form_problems(form) or ["Give an id prefix or an age."],
                "stores": configured_stores(),
                "tenants": sorted(tenants),
            },
            status=400,
        )
    plan = services.plan_purge(store_names=form.store_list(), filters=form.filters())
    if plan.errors or typed != str(plan.count):
        problem = (
            "Some stores cannot be read, so nothing was purged."
            if plan.errors
            else f"You typed {typed or 'nothing'}, but {plan.count} sessions match now. Nothing was purged; check the list and type the number again."
        )
        context = {
            "form": form,
            "plan": plan,
            "problems": [problem],
            "stores": configured_stores(),
            "tenants": sorted(tenants),
            "query": request.POST.urlencode(),
        }
        return render(request, "sessions_admin/purge.html", context, status=409)
    result = services.purge(plan=plan, actor=request.user)
    messages.success(
        request,
        f"Purged {len(result.cleared)} sessions ({sum(c[3] for c in result.cleared)} items). Each clear is in the audit history.",
    )
    if result.failed:
        messages.error(
            request,
            f"{len(result.failed)} sessions could not be cleared: "
            + "; ".join(f[2] for f in result.failed[:5]),
        )
    return redirect(reverse("sessions_admin:list"))
