from __future__ import annotations

from django.urls import path

from approvals import policy_views, views

app_name = "approvals"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("tickets/<int:pk>/", views.ticket_detail, name="ticket"),
    path("tickets/<int:pk>/decide/", views.ticket_decide, name="decide"),
    path("tickets/<int:pk>/claim/", views.ticket_claim, name="claim"),
    path("tickets/<int:pk>/comments/", views.ticket_comment, name="comment"),
    path("tickets/batch/", views.batch_decide, name="batch"),
    path("tickets/<int:pk>/edit/", views.ticket_edit, name="edit"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/resolve/", views.run_resolve, name="resolve"),
    path("audit/", views.audit_history, name="audit"),
    path("audit/chains/", views.audit_chains, name="audit-chains"),
    path("audit/export.<str:fmt>", views.audit_export, name="audit-export"),
    path("tenant/", views.switch_tenant, name="switch-tenant"),
    path("policies/", policy_views.policy_list, name="policies"),
    path("policies/edit/", policy_views.policy_edit, name="policy-edit"),
    path("policies/remove/", policy_views.policy_remove, name="policy-remove"),
    path("policies/groups/", policy_views.group_edit, name="groups"),
    path("policies/groups/delete/", policy_views.group_delete, name="group-delete"),
]
