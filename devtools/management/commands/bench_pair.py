"""`manage.py bench_pair OTHER`: this checkout and another one side by side, on the bench
database `make bench` left (PostgreSQL, its name containing "bench").

Starts one web process (`manage.py runserver --noreload`, daphne) of each checkout, then sends
the same kinds of requests to both, alternating: decisions of paused runs as a signed-in
approver (no worker runs, so the decision is measured alone), and POST /api/v1/runs/paused with
an API token. Prints a table and writes JSON (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.models import Tenant
from devtools import processes
from devtools.bench import api_submit, database, pair, stats
from devtools.bench import clones as cloning
from devtools.management.commands.bench import PASSWORD
from devtools.management.commands.bench import Command as Bench


class Command(BaseCommand):
    help = "Measure this checkout beside another one, alternating requests, on the bench database."

    def add_arguments(self, parser) -> None:
        parser.add_argument("other", help="the other checkout's directory (its manage.py runs)")
        parser.add_argument("--decisions", type=int, default=600, help="per checkout")
        parser.add_argument("--submits", type=int, default=400, help="per checkout")
        parser.add_argument("--warm", type=int, default=20, help="calls per checkout not counted")
        parser.add_argument("--json", dest="json_path", default="var/bench-pair.json")

    def say(self, text: str) -> None:
        self.stdout.write(f"[{time.strftime('%H:%M:%S')}] {text}")
        self.stdout.flush()

    def handle(self, *args, other: str, json_path: str, **options) -> None:
        other_root = Path(other).resolve()
        if not (other_root / "manage.py").is_file():
            raise CommandError(f"{other} is not a checkout of the console: it has no manage.py")
        for name in ("decisions", "submits"):
            if options[name] <= options["warm"]:
                raise CommandError(f"--{name} must be more than --warm ({options['warm']})")
        database_name = database.bench_database_name()
        tenant = Tenant.objects.filter(slug="bench").first()
        users = get_user_model()
        people = {
            u.username: u for u in users.objects.filter(username__in=["bench-dev", "bench-rm"])
        }
        if tenant is None or len(people) != 2:
            raise CommandError(
                f"database {database_name} has no bench tenant and people: run `make bench` first"
            )
        here = Path(settings.BASE_DIR).resolve()
        roots = [here, other_root]
        names = [f"{root} ({pair.commit_of(root)})" for root in roots]
        settings.DEBUG = False
        procs = processes.Processes(here / "var" / "bench" / "pair-logs")
        try:
            report = self.measure(procs, roots, tenant, people, options)
        finally:
            procs.stop_all()
        text = pair.table(report, names)
        self.stdout.write(text)
        out = {
            "checkouts": names,
            "database": database_name,
            "measures": {
                key: [stats.summary_ms(side) for side in value] for key, value in report.items()
            },
            "table_markdown": text,
            "finished_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        self.say(f"wrote {path}")

    def measure(self, procs, roots, tenant, people, options) -> dict[str, Any]:
        requester, approver = people["bench-dev"], people["bench-rm"]
        env = Bench().web_env()
        webs = [processes.start_web(procs, env, root=root)[0] for root in roots]
        self.say(f"web processes up: {', '.join(webs)}")
        report: dict[str, Any] = {}

        rounds = options["decisions"]
        template, text = cloning.make_template(tenant, requester)
        stamp = time.strftime("%H%M%S")
        releases = [f"2026.12.12-pair{stamp}{n:05d}" for n in range(2 * rounds)]
        clones = cloning.clone_runs(template, text, tenant, requester, releases)
        clients = []
        for url in webs:
            client = processes.ConsoleClient(url)
            client.login(approver.username, PASSWORD)
            clients.append(client)

        def decide_on(side: int):
            def call(number: int) -> None:
                status = clients[side].decide(clones[number].ticket_id).status
                if status != 302:
                    raise CommandError(f"a decision on {webs[side]} answered {status}")

            return call

        report["decision"] = pair.alternate(
            [decide_on(0), decide_on(1)], rounds, warm=options["warm"]
        )
        self.say("decisions measured")

        rounds = options["submits"]
        bodies = [
            api_submit.submit_body(result)
            for result in api_submit.paused_results(
                [f"2026.12.12-api{stamp}{n:05d}" for n in range(2 * rounds)]
            )
        ]
        secret = api_submit.bench_token(tenant, requester)
        connections = [api_submit.ApiConnection(url, secret) for url in webs]

        def submit_on(side: int):
            def call(number: int) -> None:
                status, answer = connections[side].post(api_submit.SUBMIT_PATH, bodies[number])
                if status != 201:
                    raise CommandError(
                        f"a submit to {webs[side]} answered {status}: {answer[:300]}"
                    )

            return call

        try:
            report["api_submit"] = pair.alternate(
                [submit_on(0), submit_on(1)], rounds, warm=options["warm"]
            )
        finally:
            for connection in connections:
                connection.close()
        self.say("API submits measured")
        return report
