"""Absolute links to the console's pages, for whatever leaves it (emails, webhooks, the API).

Every one is built here from APPROVALS_PUBLIC_URL, the one setting that says where people reach
the console, path prefix included (in development http://127.0.0.1:$PORT unless it is set).
"""

from __future__ import annotations

from django.conf import settings
from django.urls import get_script_prefix, reverse


def public_url(viewname: str, *args: object) -> str:
    """The absolute URL of a console page, e.g. public_url("approvals:ticket", 12).

    The same from a worker and from a request served under a path prefix (SCRIPT_NAME): the
    prefix belongs to APPROVALS_PUBLIC_URL, so the one reverse() adds is taken off.
    """
    path = reverse(viewname, args=args or None)
    prefix = get_script_prefix()
    if prefix != "/" and path.startswith(prefix):
        path = "/" + path[len(prefix) :]
    return settings.APPROVALS_PUBLIC_URL.rstrip("/") + path
