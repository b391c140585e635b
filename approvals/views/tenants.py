"""The tenant switcher."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
)
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from approvals.forms.decisions import TenantSwitchForm
from approvals.views import access


@login_required
@require_POST
def switch_tenant(request: HttpRequest) -> HttpResponse:
    form = TenantSwitchForm(request.POST)
    slugs = {m.tenant.slug for m in access.memberships(request).values()}
    if not form.is_valid() or (
        form.cleaned_data["tenant"] and form.cleaned_data["tenant"] not in slugs
    ):
        return HttpResponseBadRequest("You are not a member of that tenant.")
    request.session["console_tenant"] = form.cleaned_data["tenant"]
    target = form.cleaned_data["next"] or reverse("approvals:queue")
    # Only a path on this site; redirect() would also try a bare word as a view name.
    if not target.startswith("/") or not url_has_allowed_host_and_scheme(
        target, {request.get_host()}, request.is_secure()
    ):
        target = reverse("approvals:queue")
    return HttpResponseRedirect(target)
