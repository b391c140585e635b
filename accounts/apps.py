from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts: sign-in, single sign-on, two-factor"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import receivers  # noqa: F401  (connects allauth's signals to the audit)
