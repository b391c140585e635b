"""One pass of the reaper: re-queue runs whose worker died, expire undecided tickets."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from approvals.runs import reaper


class Command(BaseCommand):
    help = "Re-queue runs whose lease expired and expire tickets nobody decided in time."

    def handle(self, *args, **options) -> None:
        report = reaper.reap()
        self.stdout.write(
            f"requeued {len(report.requeued)}, re-enqueued {len(report.reenqueued)}, "
            f"expired {len(report.expired_runs)} runs"
        )
