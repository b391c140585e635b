"""The API's authentication: a bearer token with a scope, counted against its rate limit."""

from __future__ import annotations

from django.http import HttpRequest
from ninja.security import HttpBearer

from api import tokens
from api.models import ApiToken


class TokenAuth(HttpBearer):
    """Authorization: Bearer apc_... with the scope the operation needs.

    Every refusal raises (api.errors answers it): 401 saying why the token does not
    authenticate, 429 past the token's rate limit, 403 for a missing scope.
    """

    openapi_bearerFormat = "apc_<prefix>_<secret>"

    def __init__(self, scope: str) -> None:
        super().__init__()
        self.scope = scope

    def __call__(self, request: HttpRequest) -> ApiToken:
        token = tokens.authenticate(request.headers.get("Authorization"))
        tokens.throttle(token)
        tokens.record_use(token, method=request.method or "", path=request.path)
        tokens.require_scope(token, self.scope)
        return token

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken:
        # Unused: __call__ reads the header itself, to say why a missing one is refused.
        raise NotImplementedError
