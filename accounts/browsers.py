"""A session's browser in words ("Chrome on Linux") from its User-Agent header, for the list of
one's sessions. allauth stores the header as it came; this reads the few names people know."""

from __future__ import annotations

import re

# Checked in order: Edge and Opera also say "Chrome", Chrome also says "Safari".
_BROWSERS = (
    ("Edge", re.compile(r"\bEdg(?:e|A|iOS)?/")),
    ("Opera", re.compile(r"\bOPR/|\bOpera\b")),
    ("Firefox", re.compile(r"\bFirefox/|\bFxiOS/")),
    ("Chromium", re.compile(r"\bChromium/")),
    ("Chrome", re.compile(r"\bChrome/|\bCriOS/|\bHeadlessChrome/")),
    ("Safari", re.compile(r"\bSafari/")),
    ("curl", re.compile(r"^curl/")),
    ("Python", re.compile(r"^python-|^Python-")),
)
_SYSTEMS = (
    ("iOS", re.compile(r"\biPhone\b|\biPad\b|\biPod\b")),
    ("Android", re.compile(r"\bAndroid\b")),
    ("ChromeOS", re.compile(r"\bCrOS\b")),
    ("Windows", re.compile(r"\bWindows\b")),
    ("macOS", re.compile(r"\bMac OS X\b|\bMacintosh\b")),
    ("Linux", re.compile(r"\bLinux\b|\bX11\b")),
)


def _first(table, text: str) -> str:
    return next((name for name, pattern in table if pattern.search(text)), "")


def describe(user_agent: str) -> str:
    """ "Chrome on Linux", "Safari on iOS", "Firefox", "Unknown browser"."""
    text = (user_agent or "").strip()
    browser, system = _first(_BROWSERS, text), _first(_SYSTEMS, text)
    if browser and system:
        return f"{browser} on {system}"
    if browser or system:
        return browser or f"A browser on {system}"
    return "Unknown browser"
