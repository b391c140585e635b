#!/usr/bin/env python
"""Django's command-line utility; a configuration error is one line, not a traceback."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as error:
        print(f"configuration error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
