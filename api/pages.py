"""The console's pages of the API: its tokens (tenant admins only) and its docs."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods

from api import tokens
from api.forms import TokenForm
from api.models import ApiToken, Scope
from api.v1 import api
from approvals.models import Tenant
from approvals.views import access

FORBIDDEN = "Only a tenant's admins manage its API tokens."


def _forbidden(request: HttpRequest) -> HttpResponse:
    return render(request, "approvals/forbidden.html", {"reason": FORBIDDEN}, status=403)


def _list_context(tenants: dict[str, Tenant], form: TokenForm) -> dict:
    return {
        "tokens": ApiToken.objects.filter(tenant__in=tenants.values()).select_related(
            "tenant", "user", "created_by", "revoked_by"
        ),
        "several_tenants": len(tenants) > 1,
        "form": form,
        "scopes": Scope.choices,
    }


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    tenants = access.admin_tenants(request)
    if not tenants:
        return _forbidden(request)
    if request.method == "GET":
        form = TokenForm(tenants=tenants)
        return render(request, "api/tokens.html", _list_context(tenants, form))
    form = TokenForm(request.POST, tenants=tenants)
    if form.is_valid():
        try:
            issued = tokens.issue(
                tenant=tenants[form.cleaned_data["tenant"]],
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                user=form.person(),
                days=form.cleaned_data["days"],
                created_by=request.user,
            )
        except tokens.TokenRequestError as error:
            form.add_error(error.field if error.field in form.fields else None, error.sentence())
        else:
            # Shown in this response only: the token is stored as its hash.
            context = _list_context(tenants, TokenForm(tenants=tenants))
            context.update(created=issued.token, secret=issued.secret)
            return render(request, "api/tokens.html", context, status=201)
    return render(request, "api/tokens.html", _list_context(tenants, form), status=400)


@login_required
@require_http_methods(["GET", "POST"])
def token_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    # A token outside the user's tenants does not exist for them (404); inside, only the
    # tenant's admins may revoke it (403).
    mine = access.memberships(request)
    token = (
        ApiToken.objects.filter(prefix=prefix, tenant_id__in=mine.keys())
        .select_related("tenant", "user", "revoked_by")
        .first()
    )
    if token is None:
        raise Http404("No such token.")
    if not mine[token.tenant_id].is_admin:
        return _forbidden(request)
    if request.method == "GET":
        return render(request, "api/token_revoke.html", {"token": token})
    try:
        tokens.revoke(token, by=request.user)
    except tokens.TokenAlreadyRevokedError as error:
        messages.error(request, error.sentence())
    else:
        messages.success(
            request, f"Token {token.prefix} ({token.name}) is revoked: it is refused from now on."
        )
    return redirect("api:tokens")


@require_GET
def api_docs(request: HttpRequest) -> HttpResponse:
    """The API's operations, read from its OpenAPI schema, on a page that needs no scripts."""
    schema = api.get_openapi_schema()
    operations = []
    for route, methods in schema["paths"].items():
        for method, operation in methods.items():
            operations.append(
                {
                    "method": method.upper(),
                    "path": route,
                    "summary": operation.get("summary", ""),
                    "description": operation.get("description", ""),
                    "token": bool(operation.get("security")),
                    "parameters": operation.get("parameters", []),
                    "body": _body_name(operation),
                    "responses": sorted(operation.get("responses", {}).items()),
                }
            )
    return render(request, "api/docs.html", {"operations": operations, "api": api})


def _body_name(operation: dict) -> str:
    content = operation.get("requestBody", {}).get("content", {})
    ref = content.get("application/json", {}).get("schema", {}).get("$ref", "")
    return ref.rsplit("/", 1)[-1]
