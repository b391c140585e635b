"""allauth's signals, connected to the capability functions that act on them (AppConfig.ready).
Each receiver does nothing but call the function."""

from __future__ import annotations
