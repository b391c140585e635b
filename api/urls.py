from __future__ import annotations

from django.urls import path

from api import pages, v1

app_name = "api"

urlpatterns = [
    path("api/v1/docs", pages.api_docs, name="docs"),
    # After every operation (config.urls) and the docs page: what is left answers the API's 404.
    path("api/v1/<path:rest>", v1.unknown_path, name="unknown"),
    path("team/tokens/", pages.token_list, name="tokens"),
    path("team/tokens/<str:prefix>/revoke/", pages.token_revoke, name="token-revoke"),
]
