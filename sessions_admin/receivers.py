"""What sessions_admin hears from approvals: a paused run's OpenAI conversation is recorded,
because the Conversations API cannot list conversations and the sessions admin must."""

from __future__ import annotations

from django.dispatch import receiver
from django.utils import timezone

from approvals.signals import run_paused
from sessions_admin.models import ConversationRecord


@receiver(run_paused, dispatch_uid="sessions_admin.record_conversation")
def _record_conversation(sender, run, **kwargs) -> None:
    if run.session_backend != "openai_conversations":
        return
    ConversationRecord.objects.update_or_create(
        tenant_id=run.tenant_id,
        conversation_id=run.session_id,
        defaults={"last_seen": timezone.now()},
    )
