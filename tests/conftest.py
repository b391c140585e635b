from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from asgiref.sync import SyncToAsync
from django.conf import settings as django_settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections
from django.db.migrations.executor import MigrationExecutor

from approvals.audit import guard
from approvals.core import statements
from approvals.live import hints
from devtools.management.commands.webhook_receiver import make_server
from devtools.processes import child_env, database_url  # noqa: F401 - tests import them here

ROOT = Path(__file__).resolve().parent.parent
# How long a test process under the mutation run waits for SQLite's write lock.
MUTATION_LOCK_WAIT_S = 3


def _fresh_thread_sensitive_executor() -> None:
    """asgiref runs thread-sensitive sync code, outside a request, on one executor thread made
    at first use. A process forked after that (the mutation run forks one per mutant from the
    process that ran the suite) inherits the executor without its thread, and the executor,
    thinking its thread idle, never starts another: the work handed to it would never run."""
    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)


os.register_at_fork(after_in_child=_fresh_thread_sensitive_executor)

# Every statement written once per shape is also written by the ORM on each call and compared
# (core.statements), here and in the processes the tests start.
os.environ["APPROVALS_CHECK_STATEMENTS"] = "1"
statements.CHECKING = True


_DATABASE_FIXTURES = {"db", "transactional_db", "live_server", "django_db_reset_sequences"}


def _uses_database(item: pytest.Item) -> bool:
    return item.get_closest_marker("django_db") is not None or bool(
        _DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


def mutated_function(mutant: str) -> str:
    """The function a mutant changes, dotted as a `guards` marker names it:
    `approvals.runs.lease.x_run_agent__mutmut_7` -> `approvals.runs.lease.run_agent`, and a
    method's `...xǁClassǁmethod__mutmut_2` -> `....Class.method`; "" for anything else."""
    module, _, mangled = mutant.partition("__mutmut_")[0].rpartition(".")
    if not module or "__mutmut_" not in mutant:
        return ""
    if mangled.startswith("x_"):
        return f"{module}.{mangled[2:]}"
    _, cls, method = mangled.split("ǁ", 2) if mangled.count("ǁ") == 2 else ("", "", "")
    return f"{module}.{cls}.{method}" if method else ""


def _guards(item: pytest.Item, function: str) -> bool:
    return any(function in marker.args for marker in item.iter_markers("guards"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under the mutation run, the tests that guard the mutated function go first, then the
    tests that need no database.

    mutmut hands a mutant's tests fastest first and stops at the first failure. Where a
    function's guard is slow by nature (the heartbeat's tests wait for renewals on a real
    clock), every faster test of the function ran before it, passing, for every mutant it
    alone catches: a test marked `@pytest.mark.guards("<module>.<function>")` runs first for
    that function's mutants. And pytest-django moves every test without a database to the end:
    the known-answer tests that catch most mutants in milliseconds ran after hundreds of
    database tests. Neither order changes an outcome (each test stands alone); the database
    tests keep pytest-django's order (non-transactional, then transactional).
    """
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if mutant:
        function = mutated_function(mutant)
        items.sort(key=lambda item: (not _guards(item, function), _uses_database(item)))


def _mutation_sqlite() -> bool:
    """Under the mutation run (`make mutants`), on SQLite."""
    return bool(os.environ.get("MUTANT_UNDER_TEST")) and django_settings.DATABASES["default"][
        "ENGINE"
    ].endswith("sqlite3")


@pytest.fixture(scope="session")
def django_db_keepdb(request) -> bool:
    """Under the mutation run each process starts from a migrated copy (below), kept as it is:
    migrating afresh for each of a couple of thousand mutants would cost hours."""
    return bool(request.config.getvalue("reuse_db")) or bool(os.environ.get("MUTANT_UNDER_TEST"))


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix, django_db_blocker
) -> Iterator[None]:
    """Under the mutation run (`make mutants`) each process checks mutants in parallel with
    others: give it a test database of its own, named from the untouched NAME so that a forked
    process never stacks suffixes on its parent's. The first process to finish leaves its
    migrated database as the template the next ones copy, and each removes its own copy."""
    if not os.environ.get("MUTANT_UNDER_TEST"):
        yield
        return
    database = django_settings.DATABASES["default"]
    name = Path(database["NAME"])
    if not _mutation_sqlite():
        yield from _mutation_postgres_database(database, name.name, django_db_blocker)
        return
    test_file = name.with_name(f".test-{os.getpid()}-{name.name}")
    template = name.with_name(f".test-template-{name.name}")
    if template.exists():
        shutil.copyfile(template, test_file)
    database.setdefault("TEST", {})["NAME"] = str(test_file)
    # A mutant that lets a tool run inside a test that holds the write lock (one that expects
    # nothing to run) would wait out the 30 s lock timeout: the mutant is caught either way,
    # a few seconds sooner. The suite's own waits for the lock are far shorter than this.
    options = database.setdefault("OPTIONS", {})
    lock_wait = options.get("timeout", 5)
    options["timeout"] = MUTATION_LOCK_WAIT_S
    connection.settings_dict.setdefault("OPTIONS", {})["timeout"] = MUTATION_LOCK_WAIT_S
    yield
    options["timeout"] = connection.settings_dict["OPTIONS"]["timeout"] = lock_wait
    # A kept database is never torn down, so Django's switch of NAME to it is undone here: the
    # next session in this process (mutmut runs several) starts from the real name again.
    connection.close()
    database["NAME"] = connection.settings_dict["NAME"] = str(name)
    if template.exists():
        test_file.unlink(missing_ok=True)
    else:
        test_file.replace(template)


def _migrations_digest() -> str:
    """What the migrations say, in 10 characters: a template database of older ones is not used."""
    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("*/migrations/*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]


def _mutation_postgres_database(database: dict, name: str, blocker) -> Iterator[None]:
    """The PostgreSQL leg of the mutation run: this process's test database is a copy of a
    migrated template (CREATE DATABASE ... TEMPLATE, a file copy on the server), made by the
    first process to finish with every migration applied, and named for the migrations."""
    quote = connection.ops.quote_name
    own = f"test_{name}_{os.getpid()}"
    prefix = f"test_{name}_template_"
    template = prefix + _migrations_digest()
    database.setdefault("TEST", {})["NAME"] = own
    # No connection pool: a process forked from one that had the pool inherits it without its
    # threads (getconn then waits seconds in vain), and each session has a database of its own.
    for options in (database.setdefault("OPTIONS", {}), connection.settings_dict["OPTIONS"]):
        options["pool"] = False
    type(connections[DEFAULT_DB_ALIAS])._connection_pools.pop(DEFAULT_DB_ALIAS, None)
    with blocker.unblock(), connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quote(own)} WITH (FORCE)")
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [template])
        copied = cursor.fetchone() is not None
        if copied:
            cursor.execute(f"CREATE DATABASE {quote(own)} TEMPLATE {quote(template)}")
    yield
    # A session whose set-up failed (mutmut's forced failure) leaves a database half made.
    with blocker.unblock():
        keep = not copied and _fully_migrated()
    connection.close()
    database["NAME"] = connection.settings_dict["NAME"] = name
    with blocker.unblock(), connection._nodb_cursor() as cursor:
        if keep:
            cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [prefix + "%"])
            for (stale,) in cursor.fetchall():
                if stale.startswith(prefix) and stale != template:
                    cursor.execute(f"DROP DATABASE IF EXISTS {quote(stale)} WITH (FORCE)")
            # A test's thread may still hold a connection, which a rename would fail on.
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [own]
            )
            with contextlib.suppress(DatabaseError):
                # Unless another process left its template first: then this copy is dropped.
                cursor.execute(f"ALTER DATABASE {quote(own)} RENAME TO {quote(template)}")
                return
        cursor.execute(f"DROP DATABASE IF EXISTS {quote(own)} WITH (FORCE)")


def _fully_migrated() -> bool:
    """Whether the test database of this session has every migration applied."""
    try:
        executor = MigrationExecutor(connection)
        return not executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError:
        return False


@pytest.fixture(autouse=True)
def _no_real_model(settings, monkeypatch):
    """Tests never reach a real model: no key, and any OpenAI model call fails loudly."""
    settings.OPENAI_API_KEY = ""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    from agents.models import openai_chatcompletions, openai_responses

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to call a real OpenAI model")

    monkeypatch.setattr(openai_responses.OpenAIResponsesModel, "get_response", refuse)
    monkeypatch.setattr(openai_chatcompletions.OpenAIChatCompletionsModel, "get_response", refuse)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    """Test users are made by the dozen; the production hasher would cost a second each."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _private_webhooks_allowed(settings):
    """Test receivers listen on 127.0.0.1 (as the demo's does), so private webhook targets are
    allowed, whatever the environment says; the tests of the SSRF guard turn it off."""
    settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS = True


@pytest.fixture(autouse=True)
def _public_url(settings):
    """Links in tests name the development default, whatever PORT or HOST the shell exports."""
    settings.APPROVALS_PUBLIC_URL = "http://127.0.0.1:8000"


@pytest.fixture(autouse=True)
def effect_log(tmp_path, settings, monkeypatch) -> Path:
    """Where the demo tools record each real side effect, per test and for its subprocesses."""
    path = tmp_path / "effects.log"
    settings.APPROVALS_DEMO_EFFECT_LOG = path
    monkeypatch.setenv("APPROVALS_DEMO_EFFECT_LOG", str(path))
    return path


@pytest.fixture(autouse=True)
def _audit_guard(request):
    """Keep the append-only triggers in place, except while the test database is flushed.

    A transactional test ends with a flush, which on SQLite is DELETE (refused by the trigger);
    this fixture is set up after the database fixture, so its teardown runs first and lifts
    the guard for that flush only.
    """
    marker = request.node.get_closest_marker("django_db")
    names = request.fixturenames
    transactional = (
        "transactional_db" in names
        or "live_server" in names
        or bool(marker and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])))
    )
    if transactional:
        request.getfixturevalue("_django_db_helper" if marker else "transactional_db")
    elif marker or "db" in names:
        request.getfixturevalue("_django_db_helper" if marker else "db")
    else:
        yield
        return
    guard.install(connection)
    yield
    if transactional:
        guard.remove(connection)


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts against the test database."""
    return child_env(**extra)


def manage(*args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """Start `manage.py ARGS` as a separate process against the test database."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env or subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


@pytest.fixture
def manage_process():
    """Start manage.py subprocesses; every one is killed and reaped when the test ends."""
    started: list[subprocess.Popen] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        process = manage(*args, env=env)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


# --- live hints, as a shared channel layer would carry them ---------------------------------


class HintSender:
    """Stands for the process's sender loop, in front of a shared channel layer."""

    def __init__(self) -> None:
        self.one: list[tuple[str, dict]] = []
        self.many: list[list[tuple[str, dict]]] = []

    def send(self, group: str, message: dict) -> None:
        self.one.append((group, message))

    def send_many(self, held: list[tuple[str, dict]], *, here: bool = False) -> None:
        self.many.append(list(held))

    @property
    def sent(self) -> list[tuple[str, dict]]:
        """Every hint sent, alone or in a batch."""
        return self.one + [hint for batch in self.many for hint in batch]


@pytest.fixture
def live_sender(monkeypatch) -> HintSender:
    """The live hints sent, recorded instead of going to a channel layer (as with Redis)."""
    fake = HintSender()
    monkeypatch.setattr(hints, "_sender", fake)
    monkeypatch.setattr(hints, "_shared_layer", object)
    return fake


# --- a webhook receiver on loopback (notifications and browser tests) ------------------------


@dataclass
class Received:
    line: str
    verified: bool
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Receiver:
    """A real HTTP receiver on 127.0.0.1 that verifies signatures with the given secrets."""

    url: str
    secrets: list[str]
    received: list[Received] = field(default_factory=list)

    @property
    def verified(self) -> list[Received]:
        return [r for r in self.received if r.verified]


def _serve(status: int):
    receiver = Receiver(url="", secrets=[])
    server = make_server(
        "127.0.0.1",
        0,
        lambda: list(receiver.secrets),
        lambda line, ok, body, headers: receiver.received.append(Received(line, ok, body, headers)),
        status=status,
    )
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread, receiver


@pytest.fixture
def receiver():
    server, thread, found = _serve(204)
    yield found
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def failing_receiver():
    """Verifies the signature, then answers 500 every time."""
    server, thread, found = _serve(500)
    yield found
    server.shutdown()
    server.server_close()
    thread.join(5)
