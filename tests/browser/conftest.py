"""A live console for browser tests: the real ASGI server and worker against the test database.

Django's live_server is WSGI and has no websockets, so each test starts `manage.py runserver`
(daphne's ASGI runserver: HTTP, websockets, static files in DEBUG) and `manage.py worker` as
subprocesses with tests.conftest.subprocess_env(), which points them at the test database and
the test's effect log. Tests mark themselves django_db(transaction=True), so rows made in the
test process are committed and visible to both processes.

Playwright drives Debian's /usr/bin/chromium (`playwright install` cannot download here). Its
sync API keeps an event loop running while it is open, and Django refuses ORM calls (and
asyncio.run refuses to start) under a running loop: so tests make their data first, drive the
browser inside `with console_browser() as browser:`, and read the database after the block.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.processes import ROOT, Proc, Processes, start_web
from tests.conftest import subprocess_env
from tests.support import PASSWORD

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_MISSING = "Chromium not installed at /usr/bin/chromium: apt-get install chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = ROOT / "test-artifacts"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
# Waits on observable state in the page or the processes; never a fixed sleep.
TIMEOUT_MS = 15_000


def chromium_skip_reason() -> str:
    """Why the browser tests cannot run here, or "" when they can."""
    if not CHROMIUM.exists():
        return CHROMIUM_MISSING
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright (Python) is not installed: pip install -e '.[test]'"
    return ""


@dataclass
class LiveConsole:
    url: str
    processes: list[Proc]

    def logs(self) -> str:
        return "\n".join(process.tail() for process in self.processes)


@pytest.fixture
def browser_users(settings):
    """Users who sign in through the server: their hashes must be ones the server accepts.

    The suite-wide test hasher (MD5) is not in the server's PASSWORD_HASHERS, so passwords
    made here use Django's default PBKDF2 (a fraction of a second each).
    """
    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
        "django.contrib.auth.hashers.MD5PasswordHasher",
    ]


def _live_console(request, *, worker: bool) -> Iterator[LiveConsole]:
    reason = chromium_skip_reason()
    if reason:
        pytest.skip(reason)
    logs = ARTIFACTS / "logs"
    name = request.node.name
    env = subprocess_env(LOG_LEVEL="INFO")
    procs = Processes(logs)
    try:
        url, _ = start_web(procs, env, log=logs / f"{name}-server.log")
        if worker:
            procs.start(
                "worker", "worker", "--interval", "0.2", env=env, log=logs / f"{name}-worker.log"
            )
        yield LiveConsole(url, procs.started)
    finally:
        # Killed and reaped before the test database is flushed.
        procs.stop_all(kill=True)


@pytest.fixture
def live_console(request, browser_users) -> Iterator[LiveConsole]:
    """`manage.py runserver` (ASGI) and `manage.py worker` against the test database.

    Both are killed and reaped when the test ends, before the test database is flushed.
    """
    yield from _live_console(request, worker=True)


@pytest.fixture
def live_server_only(request, browser_users) -> Iterator[LiveConsole]:
    """The ASGI server without a worker: the test decides when a run moves."""
    yield from _live_console(request, worker=False)


def approve_confirmed(page, form: str = "#decide-form") -> None:
    """Click the form's approve button and confirm in the dialog console.js opens. Waits for
    the page's load event first: console.js is deferred, and a click before it runs submits
    the form with no dialog (after a link's click, the new URL shows before the script runs)."""
    page.wait_for_load_state("load")
    page.click(f"{form} button.approve")
    page.locator("dialog.confirm[open] button.approve").click()


def screenshot(page, name: str, *, docs: str | None = None) -> Path:
    """Save a full-page screenshot under test-artifacts/; with UPDATE_SCREENSHOTS=1, also copy
    it to docs/screenshots/<docs>.png for the README."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if docs and os.environ.get("UPDATE_SCREENSHOTS") == "1":
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_SCREENSHOTS / f"{docs}.png")
    return path


@pytest.fixture
def console_browser(request) -> Callable[[], contextlib.AbstractContextManager]:
    """`with console_browser() as browser:` a headless Chromium; on failure, every open page
    is saved as test-artifacts/failed-<test>-<n>.png and the processes' logs are printed."""

    for stale in ARTIFACTS.glob(f"failed-{request.node.name}-*.png"):
        stale.unlink()

    @contextlib.contextmanager
    def open_browser():
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                yield browser
            except BaseException:
                pages = [p for c in browser.contexts for p in c.pages]
                for index, page in enumerate(pages, start=1):
                    with contextlib.suppress(Exception):
                        screenshot(page, f"failed-{request.node.name}-{index}")
                for fixture in ("live_console", "live_server_only"):
                    if fixture in request.fixturenames:
                        print(request.getfixturevalue(fixture).logs())
                raise
            finally:
                browser.close()

    return open_browser


def new_page(browser, console: LiveConsole):
    """A fresh browser context (its own cookies) and page, with the tests' timeout."""
    context = browser.new_context(base_url=console.url, viewport={"width": 1280, "height": 860})
    context.set_default_timeout(TIMEOUT_MS)
    return context.new_page()


def passkey_page(browser, console: LiveConsole, *, width: int = 1280, height: int = 860):
    """A fresh context and page on http://localhost:<port> with a virtual authenticator.

    WebAuthn refuses an IP address as relying party id, and allauth takes the id from the
    request's host: the page is on localhost (a secure context without TLS), not 127.0.0.1.
    The authenticator is Chromium's DevTools one: a platform authenticator with resident keys
    that verifies the user and confirms presence by itself. Returns (page, authenticator_id).
    """
    url = console.url.replace("127.0.0.1", "localhost")
    context = browser.new_context(base_url=url, viewport={"width": width, "height": height})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    authenticator_id = add_virtual_authenticator(page)
    return page, authenticator_id


def add_virtual_authenticator(page) -> str:
    """Chromium's virtual authenticator on the page (DevTools protocol WebAuthn domain)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    added = cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            }
        },
    )
    # Kept on the page: the session must live as long as the authenticator is used.
    page._virtual_authenticator_cdp = cdp
    return added["authenticatorId"]


def virtual_credentials(page, authenticator_id: str) -> list[dict]:
    """The credentials the virtual authenticator holds (one per passkey registered)."""
    cdp = page._virtual_authenticator_cdp
    return cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator_id})["credentials"]


def confirm_password(page, password: str = PASSWORD) -> None:
    """Answer allauth's "Confirm Access" page (asked before any change to a person's second
    factors) with the password, by keyboard."""
    from playwright.sync_api import expect

    expect(page).to_have_url(re.compile(r"/accounts/reauthenticate/"), timeout=TIMEOUT_MS)
    page.fill("input[name=password]", password)
    page.keyboard.press("Enter")
