"""`manage.py bench_pair OTHER`: this checkout and another one side by side, on the bench
database `make bench` left (PostgreSQL, its name containing "bench").

Starts one web process (`manage.py runserver --noreload`, daphne) of each checkout, then sends
the same kinds of requests to both, alternating: decisions of paused runs as a signed-in
approver (no worker runs, so the decision is measured alone), and POST /api/v1/runs/paused with
an API token. Then resumes: batches of approved runs, each resumed by 2 workers of one
checkout, alternating; a batch's figure is its wall time per resume, from its first claim to
its last end as stored (the workers' start not in it). Prints a table and writes JSON
(docs/PERFORMANCE.md).
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
        parser.add_argument("--decisions", type=int, default=600, help="per checkout (0: none)")
        parser.add_argument("--submits", type=int, default=400, help="per checkout (0: none)")
        parser.add_argument("--warm", type=int, default=20, help="calls per checkout not counted")
        parser.add_argument(
            "--resume-batches", type=int, default=6, help="per checkout, 2 workers each (0: none)"
        )
        parser.add_argument("--resume-batch", type=int, default=150, help="runs per batch")
        parser.add_argument("--json", dest="json_path", default="var/bench-pair.json")

    def say(self, text: str) -> None:
        self.stdout.write(f"[{time.strftime('%H:%M:%S')}] {text}")
        self.stdout.flush()

    def handle(self, *args, other: str, json_path: str, **options) -> None:
        other_root = Path(other).resolve()
        if not (other_root / "manage.py").is_file():
            raise CommandError(f"{other} is not a checkout of the console: it has no manage.py")
        for name in ("decisions", "submits"):
            if options[name] and options[name] <= options["warm"]:
                raise CommandError(f"--{name} must be 0 or more than --warm ({options['warm']})")
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
        env = Bench().web_env()
        report: dict[str, Any] = {}
        if options["decisions"] or options["submits"]:
            webs = [processes.start_web(procs, env, root=root)[0] for root in roots]
            self.say(f"web processes up: {', '.join(webs)}")
            if options["decisions"]:
                report["decision"] = self.decisions(webs, tenant, people, options)
                self.say("decisions measured")
            if options["submits"]:
                report["api_submit"] = self.submits(webs, tenant, people, options)
                self.say("API submits measured")
        if options["resume_batches"]:
            report["resume_2_workers"] = self.resumes(procs, roots, tenant, people, options)
            self.say("resumes measured")
        return report

    def decisions(self, webs, tenant, people, options) -> list[list[float]]:
        requester, approver = people["bench-dev"], people["bench-rm"]
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

        return pair.alternate([decide_on(0), decide_on(1)], rounds, warm=options["warm"])

    def submits(self, webs, tenant, people, options) -> list[list[float]]:
        rounds = options["submits"]
        stamp = time.strftime("%H%M%S")
        bodies = [
            api_submit.submit_body(result)
            for result in api_submit.paused_results(
                [f"2026.12.12-api{stamp}{n:05d}" for n in range(2 * rounds)]
            )
        ]
        secret = api_submit.bench_token(tenant, people["bench-dev"])
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
            return pair.alternate([submit_on(0), submit_on(1)], rounds, warm=options["warm"])
        finally:
            for connection in connections:
                connection.close()

    def resumes(self, procs, roots, tenant, people, options) -> list[list[float]]:
        """Each batch's wall seconds per resume, per checkout: approved clones resumed by 2
        workers of the checkout, started for the batch and stopped after it."""
        requester, approver = people["bench-dev"], people["bench-rm"]
        size, rounds = options["resume_batch"], options["resume_batches"]
        template, text = cloning.make_template(tenant, requester)
        stamp = time.strftime("%H%M%S")
        releases = [f"2026.12.12-resume{stamp}{n:06d}" for n in range(2 * rounds * size)]
        clones = cloning.clone_runs(template, text, tenant, requester, releases)
        env = Bench().web_env()

        def resume_on(side: int):
            def call(number: int) -> float:
                batch = clones[number * size : (number + 1) * size]
                ids = [c.run_id for c in batch]
                cloning.approve_in_bulk(batch, approver)
                workers = [
                    procs.start("worker", "worker", "--interval", "1", env=env, root=roots[side])
                    for _ in range(2)
                ]
                try:
                    cloning.wait_finished(ids, timeout=300, procs=workers, poll=0.2)
                finally:
                    for worker in workers:
                        procs.stop(worker)
                once = cloning.exactly_once(c.release for c in batch)
                if once["duplicates"] or once["lost"]:
                    raise CommandError(f"a batch on {roots[side]} was not exactly once: {once}")
                return cloning.span_seconds(ids) / size

            return call

        return pair.alternate([resume_on(0), resume_on(1)], rounds, warm=0)
