from __future__ import annotations

from django.urls import path

from approvals.views import (
    audit,
    edit,
    history,
    members,
    policies,
    queue,
    records,
    runs,
    team,
    tenants,
    tickets,
)

app_name = "approvals"

urlpatterns = [
    path("", queue.queue, name="queue"),
    path("decided/", history.decided, name="decided"),
    path("decisions/mine/", history.my_decisions, name="my-decisions"),
    path("search/", history.search_page, name="search"),
    path("tickets/<int:pk>/", tickets.ticket_detail, name="ticket"),
    path("tickets/<int:pk>/decide/", tickets.ticket_decide, name="decide"),
    path("tickets/<int:pk>/step-up/", tickets.ticket_step_up, name="step-up"),
    path("tickets/<int:pk>/claim/", team.ticket_claim, name="claim"),
    path("tickets/<int:pk>/comments/", team.ticket_comment, name="comment"),
    path("tickets/batch/", team.batch_decide, name="batch"),
    path("tickets/<int:pk>/edit/", edit.ticket_edit, name="edit"),
    path("tickets/<int:pk>/record/", records.ticket_record, name="ticket-record"),
    path(
        "tickets/<int:pk>/record.<str:fmt>",
        records.ticket_record_export,
        name="ticket-record-export",
    ),
    path("runs/", runs.run_list, name="runs"),
    path("runs/<int:pk>/", runs.run_detail, name="run"),
    path("runs/<int:pk>/resolve/", runs.run_resolve, name="resolve"),
    path("audit/", audit.audit_history, name="audit"),
    path("audit/chains/", audit.audit_chains, name="audit-chains"),
    path("audit/export.<str:fmt>", audit.audit_export, name="audit-export"),
    path("tenant/", tenants.switch_tenant, name="switch-tenant"),
    path("policies/", policies.policy_list, name="policies"),
    path("policies/edit/", policies.policy_edit, name="policy-edit"),
    path("policies/remove/", policies.policy_remove, name="policy-remove"),
    path("policies/groups/", policies.group_edit, name="groups"),
    path("policies/groups/delete/", policies.group_delete, name="group-delete"),
    path("team/members/", members.member_list, name="members"),
    path("team/members/add/", members.member_add, name="member-add"),
    path("team/members/<int:user_id>/role/", members.member_role, name="member-role"),
    path("team/members/<int:user_id>/remove/", members.member_remove, name="member-remove"),
    path("team/invitations/", members.invite, name="invite"),
    path(
        "team/invitations/<int:pk>/revoke/",
        members.invitation_revoke,
        name="invitation-revoke",
    ),
    path("invitations/<str:token>/", members.invitation_accept, name="invitation"),
    path("me/", members.me, name="me"),
]
