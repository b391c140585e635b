"""Webhooks, their delivery log and the email log: admins of the tenant only; everyone else
gets 404."""

from __future__ import annotations

from datetime import datetime

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals.core.pagination import BadCursor, after_descending
from approvals.models import Membership, Role, Tenant
from notifications import deliveries, emails, endpoints
from notifications.attempts import NotRetryable
from notifications.forms import DeliveryFilterForm, EmailFilterForm, EndpointForm
from notifications.models import Delivery, DeliveryStatus, EmailDelivery, WebhookEndpoint

DELIVERY_PAGE = 50
EMAIL_PAGE = 50


def _admin_tenants(request: HttpRequest) -> dict[str, Tenant]:
    return {
        m.tenant.slug: m.tenant
        for m in Membership.objects.filter(user=request.user, role=Role.ADMIN).select_related(
            "tenant"
        )
    }


def _get_tenant_for_admin(request: HttpRequest, slug: str) -> Tenant:
    tenant = _admin_tenants(request).get(slug)
    if tenant is None:
        raise Http404("No such page.")
    return tenant


def _get_endpoint_for_admin(request: HttpRequest, slug: str, pk: int) -> WebhookEndpoint:
    tenant = _get_tenant_for_admin(request, slug)
    endpoint = WebhookEndpoint.objects.filter(pk=pk, tenant=tenant).select_related("tenant").first()
    if endpoint is None:
        raise Http404("No such webhook.")
    return endpoint


def _get_delivery_for_admin(request: HttpRequest, slug: str, pk: int) -> Delivery:
    tenant = _get_tenant_for_admin(request, slug)
    delivery = Delivery.objects.filter(pk=pk, tenant=tenant).select_related("endpoint").first()
    if delivery is None:
        raise Http404("No such delivery.")
    return delivery


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    tenants = _admin_tenants(request)
    if not tenants:
        raise Http404("No such page.")
    active = request.session.get("console_tenant", "")
    slug = active if active in tenants else sorted(tenants)[0]
    return redirect("notifications:webhooks", tenant=slug)


def _list_context(request: HttpRequest, tenant: Tenant, form: EndpointForm) -> dict:
    return {
        "tenant": tenant,
        "admin_tenants": sorted(_admin_tenants(request)),
        "endpoints": WebhookEndpoint.objects.filter(tenant=tenant).order_by("pk"),
        "form": form,
    }


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def endpoint_list(request: HttpRequest, tenant: str) -> HttpResponse:
    tenant_row = _get_tenant_for_admin(request, tenant)
    if request.method == "POST":
        form = EndpointForm(request.POST)
        if form.is_valid():
            endpoint, secret = endpoints.create_endpoint(
                tenant=tenant_row, user=request.user, **form.cleaned_data
            )
            # Shown in this response only: the secret is stored sealed and never shown again.
            context = _list_context(request, tenant_row, EndpointForm(initial={"active": True}))
            context.update(created=endpoint, secret=secret)
            return render(request, "notifications/webhooks.html", context, status=201)
        context = _list_context(request, tenant_row, form)
        return render(request, "notifications/webhooks.html", context, status=400)
    form = EndpointForm(initial={"active": True, "events": []})
    return render(request, "notifications/webhooks.html", _list_context(request, tenant_row, form))


@login_required
@require_http_methods(["GET", "POST"])
def endpoint_edit(request: HttpRequest, tenant: str, endpoint: int) -> HttpResponse:
    row = _get_endpoint_for_admin(request, tenant, endpoint)
    status = 200
    if request.method == "POST":
        form = EndpointForm(request.POST, saved_url=row.url)
        if form.is_valid():
            endpoints.update_endpoint(row, user=request.user, **form.cleaned_data)
            messages.success(request, "Webhook saved.")
            return redirect("notifications:webhooks", tenant=tenant)
        status = 400
    else:
        form = EndpointForm(
            initial={
                "url": row.url,
                "description": row.description,
                "events": row.events,
                "active": row.active,
            }
        )
    context = {"tenant": row.tenant, "endpoint": row, "form": form}
    return render(request, "notifications/webhook.html", context, status=status)


@login_required
@require_POST
def endpoint_delete(request: HttpRequest, tenant: str, endpoint: int) -> HttpResponse:
    row = _get_endpoint_for_admin(request, tenant, endpoint)
    endpoints.delete_endpoint(row, user=request.user)
    messages.success(request, "Webhook deleted with its delivery log.")
    return redirect("notifications:webhooks", tenant=tenant)


@login_required
@require_POST
def endpoint_ping(request: HttpRequest, tenant: str, endpoint: int) -> HttpResponse:
    row = _get_endpoint_for_admin(request, tenant, endpoint)
    outcome = deliveries.ping(row, user=request.user)
    took = f"in {outcome.duration_ms} ms"
    if outcome.ok:
        messages.success(
            request, f"Test event delivered to webhook {row.pk}: HTTP {outcome.status_code} {took}."
        )
    else:
        answer = outcome.error or f"HTTP {outcome.status_code}"
        messages.error(
            request,
            f"Test event to webhook {row.pk} failed: {answer} ({took}). "
            "Check the URL and that the receiver answers 2xx to a signed POST.",
        )
    return redirect("notifications:webhook", tenant=tenant, endpoint=row.pk)


@login_required
@require_GET
def delivery_log(request: HttpRequest, tenant: str) -> HttpResponse:
    tenant_row = _get_tenant_for_admin(request, tenant)
    endpoints = {e.pk: e for e in WebhookEndpoint.objects.filter(tenant=tenant_row)}
    form = DeliveryFilterForm(request.GET, endpoint_ids=set(endpoints))
    deliveries = Delivery.objects.filter(tenant=tenant_row).select_related("endpoint")
    if form.is_valid() and form.cleaned_data["endpoint"]:
        deliveries = deliveries.filter(endpoint_id=form.cleaned_data["endpoint"])
    selected = endpoints.get(form.cleaned_data.get("endpoint") or 0) if form.is_valid() else None
    return _log_page(
        request,
        form,
        deliveries,
        DELIVERY_PAGE,
        template="notifications/deliveries.html",
        region="delivery-rows",
        tenant=tenant_row,
        endpoints=list(endpoints.values()),
        selected=selected,
    )


@login_required
@require_POST
def delivery_retry(request: HttpRequest, tenant: str, delivery: int) -> HttpResponse:
    row = _get_delivery_for_admin(request, tenant, delivery)
    try:
        deliveries.retry(row, user=request.user)
    except NotRetryable as error:
        messages.error(request, f"Delivery {row.pk} was not retried: {error}.")
    else:
        messages.success(request, f"Delivery {row.pk} will be sent again.")
    return redirect(reverse("notifications:deliveries", kwargs={"tenant": tenant}))


@login_required
@require_GET
def email_log(request: HttpRequest, tenant: str) -> HttpResponse:
    tenant_row = _get_tenant_for_admin(request, tenant)
    return _log_page(
        request,
        EmailFilterForm(request.GET),
        EmailDelivery.objects.filter(tenant=tenant_row),
        EMAIL_PAGE,
        template="notifications/emails.html",
        region="email-rows",
        tenant=tenant_row,
    )


def _log_page(
    request: HttpRequest, form, rows, size: int, *, template: str, region: str, **context
) -> HttpResponse:
    """A log page: rows filtered by status, newest first, keyset-paged; 400 with the reasons
    when a filter or the cursor is bad; only the rows when its live region re-reads itself."""
    page = None
    if form.is_valid():
        if form.cleaned_data["status"]:
            rows = rows.filter(status=form.cleaned_data["status"])
        try:
            after = form.cleaned_data["after"] or None
            page = after_descending(rows, ("created_at", "id"), after, (datetime, int), size)
        except BadCursor as error:
            form.add_error("after", str(error))
    next_query = ""
    if page and page.next_cursor:
        query = request.GET.copy()
        query["after"] = page.next_cursor
        next_query = query.urlencode()
    context.update(
        admin_tenants=sorted(_admin_tenants(request)),
        form=form,
        page=page,
        next_query=next_query,
        problems=[m for errors in form.errors.values() for m in errors],
        statuses=DeliveryStatus.choices,
    )
    if page and request.htmx and request.htmx.target == region:
        template += "#rows"
    return render(request, template, context, status=200 if page else 400)


@login_required
@require_POST
def email_retry(request: HttpRequest, tenant: str, email: int) -> HttpResponse:
    tenant_row = _get_tenant_for_admin(request, tenant)
    row = EmailDelivery.objects.filter(pk=email, tenant=tenant_row).first()
    if row is None:
        raise Http404("No such email.")
    try:
        emails.retry_email(row, user=request.user)
    except NotRetryable as error:
        messages.error(request, f"Email {row.pk} was not retried: {error}.")
    else:
        messages.success(request, f"Email {row.pk} will be sent again.")
    return redirect(reverse("notifications:emails", kwargs={"tenant": tenant}))
