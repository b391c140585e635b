from __future__ import annotations

from django.urls import path

from api import pages

app_name = "api"

urlpatterns = [
    path("api/v1/docs", pages.api_docs, name="docs"),
    path("team/tokens/", pages.token_list, name="tokens"),
    path("team/tokens/<str:prefix>/revoke/", pages.token_revoke, name="token-revoke"),
]
