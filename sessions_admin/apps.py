from __future__ import annotations

from django.apps import AppConfig


class SessionsAdminConfig(AppConfig):
    name = "sessions_admin"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: models load after this module (Django's app loading).
        from sessions_admin import receivers  # noqa: F401  (connects to approvals' signals)
