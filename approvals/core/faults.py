"""Named crash points for fault tests: APPROVALS_FAULT=<name> kills the process right there.

Inert unless that variable is set; it exists so tests can SIGKILL a real worker at an exact
point of a resume instead of hoping a timer lands there.
"""

from __future__ import annotations

import os
import signal


def point(name: str) -> None:
    if os.environ.get("APPROVALS_FAULT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
