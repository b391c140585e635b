from __future__ import annotations

from django.apps import AppConfig


class SessionsAdminConfig(AppConfig):
    name = "sessions_admin"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"
