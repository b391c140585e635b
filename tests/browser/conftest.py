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
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, subprocess_env

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_MISSING = "Chromium not installed at /usr/bin/chromium: apt-get install chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = ROOT / "test-artifacts"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
# Waits on observable state in the page or the processes; never a fixed sleep.
TIMEOUT_MS = 15_000
STARTUP_SECONDS = 30


def chromium_skip_reason() -> str:
    """Why the browser tests cannot run here, or "" when they can."""
    if not CHROMIUM.exists():
        return CHROMIUM_MISSING
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright (Python) is not installed: pip install -e '.[test]'"
    return ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- last lines of {self.name} ({self.log}) ---\n" + "\n".join(
            text.splitlines()[-lines:]
        )


def _start(name: str, args: list[str], log: Path) -> _Process:
    # Output goes to a file, not a pipe: a chatty server must never block on a full pipe.
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        popen = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=subprocess_env(LOG_LEVEL="INFO"),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return _Process(name, popen, log)


def _wait_for_http(url: str, server: _Process) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        if server.popen.poll() is not None:
            raise AssertionError(
                f"the console server exited with {server.popen.returncode}\n{server.tail()}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the console server did not answer {url}\n{server.tail()}")
        time.sleep(0.1)


@dataclass
class LiveConsole:
    url: str
    processes: list[_Process]

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
    port = _free_port()
    processes = [
        _start(
            "server", ["runserver", "--noreload", f"127.0.0.1:{port}"], logs / f"{name}-server.log"
        )
    ]
    if worker:
        processes.append(
            _start("worker", ["worker", "--interval", "0.2"], logs / f"{name}-worker.log")
        )
    console = LiveConsole(f"http://127.0.0.1:{port}", processes)
    try:
        _wait_for_http(f"{console.url}/login/", processes[0])
        yield console
    finally:
        for process in processes:
            if process.popen.poll() is None:
                process.popen.kill()
            process.popen.wait(timeout=30)


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
