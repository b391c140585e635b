from __future__ import annotations

from django.urls import path

from sessions_admin import views

app_name = "sessions_admin"

urlpatterns = [
    path("", views.session_list, name="list"),
    path("purge/", views.purge_preview, name="purge"),
    path("purge/confirm/", views.purge_confirm, name="purge-confirm"),
    # The session id travels as ?id=: ids are arbitrary text (even empty, or ending in /clear).
    path("<str:store>/<slug:tenant>/", views.session_detail, name="detail"),
    path("<str:store>/<slug:tenant>/clear/", views.session_clear, name="clear"),
]
