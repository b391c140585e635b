"""Agent conversation sessions stored by Django's ORM, and the OpenAI conversations runs used."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from approvals.models import Tenant


class StoredSession(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="agent_sessions")
    session_id = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "session_id"], name="stored_session_unique")
        ]
        indexes = [models.Index(fields=["tenant", "updated_at"], name="stored_session_activity")]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.session_id}"


class StoredItem(models.Model):
    session = models.ForeignKey(StoredSession, on_delete=models.CASCADE, related_name="items")
    data = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["session", "id"], name="stored_item_order")]

    def __str__(self) -> str:
        return f"item {self.pk} of {self.session_id}"


class ConversationRecord(models.Model):
    """An OpenAI conversation id a run used; the Conversations API cannot list them."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="conversations")
    conversation_id = models.CharField(max_length=255)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "conversation_id"], name="conversation_record_unique"
            )
        ]

    def __str__(self) -> str:
        return self.conversation_id
