"""The console's URLs under a path of their own: for the row_url tests."""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [path("under/", include("config.urls"))]
