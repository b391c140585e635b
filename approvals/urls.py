from __future__ import annotations

from django.urls import path

from approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("tickets/<int:pk>/", views.ticket_detail, name="ticket"),
    path("tickets/<int:pk>/decide/", views.ticket_decide, name="decide"),
    path("tickets/<int:pk>/edit/", views.ticket_edit, name="edit"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/resolve/", views.run_resolve, name="resolve"),
    path("audit/", views.audit_history, name="audit"),
    path("audit/chains/", views.audit_chains, name="audit-chains"),
    path("audit/export.<str:fmt>", views.audit_export, name="audit-export"),
    path("tenant/", views.switch_tenant, name="switch-tenant"),
]
