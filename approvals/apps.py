from __future__ import annotations

from agents import set_tracing_disabled
from django.apps import AppConfig
from django.conf import settings


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: models load after this module (Django's app loading).
        from approvals.audit import sign_ins  # noqa: F401  (connects the sign-in receivers)
        from approvals.execution import queue
        from approvals.live import memberships  # noqa: F401  (connects the membership receivers)
        from approvals.runs import resume, start

        # The queue's tasks run the resume and the start, which import the queue: handed over,
        # not imported.
        queue.serve(resume=resume.resume, start=start.start)

        if not settings.OPENAI_API_KEY:
            # Without a key the SDK would try, and fail, to export traces on every run.
            set_tracing_disabled(True)
