"""A membership saved or deleted tells its user's open sockets, after commit, to re-read which
tenants they hear (hints.memberships_changed_on_commit): a member removed from a tenant stops
hearing it at once, not when the socket next reconnects. Connected in ApprovalsConfig.ready.
"""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from approvals.live import hints
from approvals.models import Membership


@receiver(post_save, sender=Membership, dispatch_uid="live-membership-saved")
def membership_saved(sender, instance: Membership, raw: bool = False, **kwargs) -> None:
    if not raw:
        hints.memberships_changed_on_commit(instance.user_id)


@receiver(post_delete, sender=Membership, dispatch_uid="live-membership-deleted")
def membership_deleted(sender, instance: Membership, **kwargs) -> None:
    hints.memberships_changed_on_commit(instance.user_id)
