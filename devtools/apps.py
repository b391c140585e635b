from __future__ import annotations

from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    """The demo agents, seed_demo, the webhook receiver, the bench and the process helpers.

    Development and tests only: production settings leave this app out, so none of its
    commands exists there.
    """

    name = "devtools"
    default_auto_field = "django.db.models.BigAutoField"
