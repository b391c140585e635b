from __future__ import annotations

from django.contrib import admin

from approvals.models import (
    ApprovalPolicy,
    AuditEvent,
    IdempotencyRecord,
    Membership,
    PreAuthorization,
    Run,
    Tenant,
    Ticket,
    TicketVote,
)


class ShownOnlyAdmin(admin.ModelAdmin):
    """A model the admin shows but never adds, edits or deletes (so no bulk delete either).

    Its rows change only through the console's capabilities, which check, compare-and-set and
    audit each change and wake what waits on it: deleting a pending ticket here left its run
    paused for ever, with nothing in the audit log.
    """

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "audit_seq", "created_at"]
    readonly_fields = ["audit_seq", "audit_head"]
    search_fields = ["slug", "name"]


# Members change on the Team page and through the commands (approvals.tenancy), which keep the
# last admin, audit the change and sign the person out; a row edited here would do none of it.
@admin.register(Membership)
class MembershipAdmin(ShownOnlyAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username"]


class TicketInline(admin.TabularInline):
    model = Ticket
    fields = ["tool_name", "status", "arguments_digest", "requested_by", "decided_by", "decided_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True


@admin.register(Run)
class RunAdmin(ShownOnlyAdmin):
    list_display = ["id", "tenant", "agent_key", "agent_version", "status", "title", "created_at"]
    list_filter = ["status", "tenant", "agent_key"]
    search_fields = ["title"]
    # The state blob is shown as its size only: it is ciphertext, and editing it breaks it.
    exclude = ["state_nonce", "state_ciphertext"]
    readonly_fields = [
        "tenant",
        "agent_key",
        "agent_version",
        "schema_version",
        "state_key_id",
        "state_generation",
        "blob_size",
        "session_backend",
        "session_id",
        "session_location",
        "lease_owner",
        "lease_expires_at",
        "attempts",
        "final_output",
        "status_reason",
        "created_at",
        "updated_at",
        "finished_at",
    ]
    inlines = [TicketInline]
    # Status changes go through approvals.transitions (compare-and-set, checks, audit), never a form.

    @admin.display(description="Encrypted state (bytes)")
    def blob_size(self, obj: Run) -> int:
        return len(obj.state_ciphertext or b"")


@admin.register(Ticket)
class TicketAdmin(ShownOnlyAdmin):
    list_display = [
        "id",
        "tenant",
        "tool_name",
        "status",
        "requested_by",
        "created_at",
        "expires_at",
    ]
    list_filter = ["status", "tenant", "tool_name"]
    list_select_related = ["tenant", "requested_by"]
    readonly_fields = [
        "run",
        "tenant",
        "generation",
        "agent_name",
        "tool_name",
        "tool_call_id",
        "arguments_json",
        "arguments_digest",
        "requested_by",
        "created_at",
    ]
    # A decision is made in the console (compare-and-set, self-approval check, audit), never
    # by editing the row here; a pending ticket deleted here would leave its run paused.


@admin.register(AuditEvent)
class AuditEventAdmin(ShownOnlyAdmin):
    list_display = ["tenant", "seq", "created_at", "actor_name", "action", "tool_name", "outcome"]
    list_filter = ["tenant", "action", "outcome"]
    list_select_related = ["tenant"]
    search_fields = ["actor_name", "tool_name", "arguments_digest"]
    # Append-only and hash-chained (audit.chain, audit.guard).


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ShownOnlyAdmin):
    list_display = [
        "operation",
        "resource",
        "status",
        "tenant",
        "run",
        "claimed_by",
        "completed_at",
    ]
    list_filter = ["status", "operation", "tenant"]
    # The ledger of effects (execution.ledger); one in doubt is settled by runs.resolution.


# Policies and votes change through approvals.policies and decisions (versioned, audited), never here.
@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(admin.ModelAdmin):
    list_display = ["tenant", "agent_key", "tool_name", "version", "required_approvals"]
    list_filter = ["tenant", "on_expiry"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(TicketVote)
class TicketVoteAdmin(ShownOnlyAdmin):
    list_display = ["ticket", "user", "policy", "created_at", "invalidated_at"]


@admin.register(PreAuthorization)
class PreAuthorizationAdmin(ShownOnlyAdmin):
    list_display = ["id", "tenant", "run", "tool_name", "created_by", "used_by", "expires_at"]
    list_filter = ["tenant", "tool_name"]
    list_select_related = ["tenant", "run", "created_by", "used_by"]

    # A pre-authorisation approves a future call in someone's name: it is made only by
    # editing a ticket in the console (permission checks, audit), never here.
