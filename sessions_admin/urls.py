from __future__ import annotations

from django.urls import path

from sessions_admin import views

app_name = "sessions_admin"

urlpatterns = [
    path("", views.session_list, name="list"),
    path("purge/", views.purge_preview, name="purge"),
    path("purge/confirm/", views.purge_confirm, name="purge-confirm"),
    path("<str:store>/<slug:tenant>/<path:session_id>/clear/", views.session_clear, name="clear"),
    path("<str:store>/<slug:tenant>/<path:session_id>/", views.session_detail, name="detail"),
]
