"""Child processes of this project (web server, workers) started against the current database.

One home for what the benchmark, the fault runs and the browser tests all need: the environment
a child must share with its parent (database, key ring, secret key, effect log), output in a file
(a chatty process must never block on a full pipe), a free port, and waiting until a web server
answers, and a signed-in client for it.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(settings.BASE_DIR)


def database_url() -> str:
    """The URL of the database this process uses now (a test database, once created)."""
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(params['NAME']).resolve()}"
    auth = params["USER"] + (f":{params['PASSWORD']}" if params["PASSWORD"] else "")
    host, port = params["HOST"] or "127.0.0.1", params["PORT"] or 5432
    return f"postgres://{auth}@{host}:{port}/{params['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child that must see this process's database, keys and effect log."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "APPROVALS_ENCRYPTION_KEYS": _ring(settings.APPROVALS_ENCRYPTION_KEYS),
        # The audit chain's keys: a child links its events as this process would.
        "APPROVALS_AUDIT_KEYS": _ring(settings.APPROVALS_AUDIT_KEYS),
        "APPROVALS_AUDIT_SIGNING_KEY": base64.urlsafe_b64encode(
            settings.APPROVALS_AUDIT_SIGNING_KEY
        ).decode(),
        # A child signs decisions with the keys this process publishes.
        "APPROVALS_DECISION_SIGNING_KEYS": _ring(settings.APPROVALS_DECISION_SIGNING_KEYS),
        "APPROVALS_DEMO_EFFECT_LOG": str(settings.APPROVALS_DEMO_EFFECT_LOG),
        # A worker delivering webhooks refuses or allows private targets as this process does.
        "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS": "1"
        if settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS
        else "0",
        # Links from a child (a worker's webhooks and emails) name the address this one does.
        "APPROVALS_PUBLIC_URL": settings.APPROVALS_PUBLIC_URL,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("OPENAI_API_KEY", None)
    env.update(extra)
    return env


def _ring(keys: list[tuple[str, bytes]]) -> str:
    return ",".join(f"{key_id}:{base64.urlsafe_b64encode(key).decode()}" for key_id, key in keys)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        text = "\n".join(self.output().splitlines()[-lines:])
        return f"--- last lines of {self.name} ({self.log}) ---\n{text}"

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0


@dataclass
class Processes:
    """Started processes, each with its output in a file under log_dir."""

    log_dir: Path
    started: list[Proc] = field(default_factory=list)

    def start(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        root: Path = ROOT,
    ) -> Proc:
        """args are manage.py arguments, or a whole command when the first is an absolute path.
        root: the checkout whose manage.py runs, and the working directory (another checkout's,
        to measure two versions side by side)."""
        argv = (
            list(args)
            if args[0].startswith("/")
            else [sys.executable, str(root / "manage.py"), *args]
        )
        log = log or self.log_dir / f"{name}-{len(self.started)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            popen = subprocess.Popen(
                argv, cwd=root, env=env or child_env(), stdout=out, stderr=subprocess.STDOUT
            )
        proc = Proc(name, popen, log)
        self.started.append(proc)
        return proc

    def stop(self, proc: Proc, *, kill: bool = False) -> None:
        if proc.alive():
            proc.popen.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
        proc.popen.wait(timeout=30)

    def stop_all(self, *, kill: bool = False) -> None:
        for proc in self.started:
            self.stop(proc, kill=kill)


def wait_for_http(url: str, server: Proc, *, timeout: float = 60, path: str = "/login/") -> None:
    """Return once url answers path with 200; fail with the server's last lines otherwise."""
    host, _, port = url.removeprefix("http://").partition(":")
    deadline = time.monotonic() + timeout
    while True:
        if not server.alive():
            raise RuntimeError(
                f"{server.name} exited with {server.popen.returncode}\n{server.tail()}"
            )
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            try:
                conn.request("GET", path)
                if conn.getresponse().status == 200:
                    return
            finally:
                conn.close()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.name} did not answer {url}\n{server.tail()}")
        time.sleep(0.1)


def start_web(
    procs: Processes,
    env: dict[str, str] | None = None,
    *,
    log: Path | None = None,
    root: Path = ROOT,
) -> tuple[str, Proc]:
    """`manage.py runserver --noreload` (daphne, ASGI) of the checkout at root on a free port,
    answering /login/."""
    port = free_port()
    server = procs.start(
        "web", "runserver", "--noreload", f"127.0.0.1:{port}", env=env, log=log, root=root
    )
    url = f"http://127.0.0.1:{port}"
    wait_for_http(url, server)
    return url, server


# --- a browser-like client on the standard library ----------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: str


@dataclass
class ConsoleClient:
    """One signed-in person: keeps cookies, sends the CSRF cookie back as X-CSRFToken."""

    base_url: str
    timeout: float = 30
    cookies: dict[str, str] = field(default_factory=dict)
    _conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            parts = urllib.parse.urlsplit(self.base_url)
            self._conn = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=self.timeout
            )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, path: str, form: dict[str, str] | None = None) -> Response:
        headers = {"Host": urllib.parse.urlsplit(self.base_url).netloc}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if method == "POST":
            headers["X-CSRFToken"] = self.cookies.get("csrftoken", "")
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            body = urllib.parse.urlencode(form or {})
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                raw = conn.getresponse()
                data = raw.read().decode(errors="replace")
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # A kept-alive connection the server closed between requests: reconnect once.
                self.close()
                if attempt == 2:
                    raise
        for value in raw.headers.get_all("Set-Cookie") or []:
            cookie = SimpleCookie()
            cookie.load(value)
            for name, morsel in cookie.items():
                self.cookies[name] = morsel.value
        if raw.getheader("Connection", "").lower() == "close":
            self.close()
        return Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, data)

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, str] | None = None) -> Response:
        return self.request("POST", path, form)

    def login(self, username: str, password: str) -> None:
        page = self.get("/login/")
        answer = self.post("/login/", {"login": username, "password": password})
        if page.status != 200 or answer.status != 302 or "sessionid" not in self.cookies:
            raise RuntimeError(
                f"sign-in of {username} at {self.base_url}: the form answered {page.status}, "
                f"the sign-in {answer.status}"
            )

    def decide(self, ticket_id: int, decision: str = "approve", message: str = "") -> Response:
        """POST a decision, and read its confirmation as the next page would: a browser shows
        it there, so the messages cookie does not grow with every decision."""
        answer = self.post(
            f"/tickets/{ticket_id}/decide/", {"decision": decision, "message": message}
        )
        self.cookies.pop("messages", None)
        return answer
