"""Child processes of this project (web server, workers) started against the current database.

One home for what the benchmark, the fault runs and the browser tests all need: the environment
a child must share with its parent (database, key ring, secret key, effect log), output in a file
(a chatty process must never block on a full pipe), a free port, and waiting until a web server
answers.
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
from dataclasses import dataclass, field
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
    keys = ",".join(
        f"{key_id}:{base64.urlsafe_b64encode(key).decode()}"
        for key_id, key in settings.APPROVALS_ENCRYPTION_KEYS
    )
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SECRET_KEY": settings.SECRET_KEY,
        "APPROVALS_ENCRYPTION_KEYS": keys,
        "APPROVALS_DEMO_EFFECT_LOG": str(settings.APPROVALS_DEMO_EFFECT_LOG),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("OPENAI_API_KEY", None)
    env.update(extra)
    return env


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
        self, name: str, *args: str, env: dict[str, str] | None = None, log: Path | None = None
    ) -> Proc:
        """args are manage.py arguments, or a whole command when the first is an absolute path."""
        argv = (
            list(args)
            if args[0].startswith("/")
            else [sys.executable, str(ROOT / "manage.py"), *args]
        )
        log = log or self.log_dir / f"{name}-{len(self.started)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            popen = subprocess.Popen(
                argv, cwd=ROOT, env=env or child_env(), stdout=out, stderr=subprocess.STDOUT
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
    procs: Processes, env: dict[str, str] | None = None, *, log: Path | None = None
) -> tuple[str, Proc]:
    """`manage.py runserver --noreload` (daphne, ASGI) on a free port, answering /login/."""
    port = free_port()
    server = procs.start("web", "runserver", "--noreload", f"127.0.0.1:{port}", env=env, log=log)
    url = f"http://127.0.0.1:{port}"
    wait_for_http(url, server)
    return url, server
