from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from approvals import signals  # noqa: F401

        if not settings.OPENAI_API_KEY:
            from agents import set_tracing_disabled

            # Without a key the SDK would try, and fail, to export traces on every run.
            set_tracing_disabled(True)
