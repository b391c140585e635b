"""`manage.py bench --json FILE`: the console's benchmark, on PostgreSQL, real processes.

Drops and recreates its own database (the name in DATABASE_URL must contain "bench"), starts
`manage.py runserver --noreload` (daphne, ASGI) and `manage.py worker` subprocesses against
it (with REDIS_URL for the channel layer when set), measures, prints a table and writes JSON.
See docs/PERFORMANCE.md for what each figure means and the last results.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.models import F, Sum
from django.db.models.functions import Coalesce
from django.test import Client

from approvals.management.commands import worker as worker_command
from approvals.models import AuditEvent, Membership, Role, Run, RunStatus, Tenant
from approvals.runs.pause import pause_run
from approvals.runs.resume import resume
from devtools import processes
from devtools.bench import api_submit, cpu, database, pages, queries, sdk, silent, stats
from devtools.bench import clones as cloning
from devtools.bench import report as bench_report
from devtools.bench.completions import Completions, phases
from devtools.processes import ConsoleClient
from notifications.fan_out import catch_up

PASSWORD = "bench-pass-2026"

TARGETS = {
    "approve_to_completed_p50_ms": 50,
    "approve_to_completed_p99_ms": 150,
    "decision_p50_ms": 15,
    "resume_per_s_workers_2": 100,
    "page_p95_ms": 30,
    "page_queries": 8,
    "queue_vs_admin_ratio": 0.5,
    "approve_vs_bare_sdk_ratio": 4,
    "pause_vs_to_json_ratio_10_turns": 3,
    "pause_vs_to_json_ratio_100_turns": 2,
    "resume_queries": 6,
    "pause_queries": 8,
    "api_submit_vs_pause_run_ratio": 2,
    "api_submit_per_s": 100,
    "blob_vs_json_ratio": 0.3,
    "worker_rss_growth_pct": 10,
}


class Command(BaseCommand):
    help = "Benchmark the console on PostgreSQL with real server and worker processes."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", dest="json_path", default="var/bench.json")
        parser.add_argument("--tickets", type=int, default=320, help="approve-to-completed")
        parser.add_argument("--memory-resumes", type=int, default=5000)
        parser.add_argument("--page-tickets", type=int, default=100_000)
        parser.add_argument("--page-events", type=int, default=300_000)
        parser.add_argument("--throughput-runs", type=int, default=600, help="2 workers; 4: x4/3")
        parser.add_argument("--skip-profile", action="store_true")
        parser.add_argument(
            "--api-requests", type=int, default=300, help="POST /runs/paused one at a time"
        )
        parser.add_argument(
            "--api-throughput-requests", type=int, default=600, help="from concurrent clients"
        )
        parser.add_argument("--api-clients", type=int, default=8)
        parser.add_argument(
            "--only-api",
            action="store_true",
            help="only the API's figures (with pause_run beside them), e.g. at small sizes",
        )

    def say(self, text: str) -> None:
        self.stdout.write(f"[{time.strftime('%H:%M:%S')}] {text}")
        self.stdout.flush()

    def handle(self, *args, json_path: str, **options) -> None:
        if options["api_requests"] < 2 or options["api_throughput_requests"] < 1:
            raise CommandError("--api-requests must be 2 or more, --api-throughput-requests 1")
        if options["api_clients"] < 1:
            raise CommandError("--api-clients must be 1 or more")
        if options["memory_resumes"] <= 500:
            # Memory is compared after 500 resumes and at the end, so the end must come later.
            raise CommandError("--memory-resumes must be more than 500")
        started = time.monotonic()
        out_dir = Path(settings.BASE_DIR) / "var" / "bench"
        out_dir.mkdir(parents=True, exist_ok=True)
        effect_log = out_dir / "effects.log"
        effect_log.unlink(missing_ok=True)
        settings.APPROVALS_DEMO_EFFECT_LOG = effect_log
        settings.DEBUG = False
        settings.OPENAI_API_KEY = ""
        name = database.recreate_database()
        self.say(f"database {name} recreated and migrated")
        procs = processes.Processes(out_dir / "logs")
        try:
            report = self.run_all(procs, out_dir, options)
        finally:
            procs.stop_all()
        report["meta"] = bench_report.meta(name, time.monotonic() - started)
        table = bench_report.table(report)
        report["table_markdown"] = table
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        self.stdout.write(table)
        self.say(f"wrote {path} in {time.monotonic() - started:.0f}s")

    # --- the whole run ------------------------------------------------------------------------

    def run_all(self, procs: processes.Processes, out_dir: Path, options: dict) -> dict[str, Any]:
        users = get_user_model()
        tenant = Tenant.objects.create(slug="bench", name="Bench")
        requester = users.objects.create_user("bench-dev", password=PASSWORD)
        approver = users.objects.create_user("bench-rm", password=PASSWORD)
        Membership.objects.create(user=requester, tenant=tenant, role=Role.VIEWER)
        Membership.objects.create(user=approver, tenant=tenant, role=Role.APPROVER)
        report: dict[str, Any] = {}
        if options["only_api"]:
            webs = self.start_webs(procs)
            report.update(self.api_submit(webs, tenant, requester, options))
            return report

        template, template_text = cloning.make_template(tenant, requester)
        n_http = options["tickets"]
        n_mem = options["memory_resumes"]
        plan = {
            "http": n_http,
            "w2": options["throughput_runs"],
            "w4": options["throughput_runs"] * 4 // 3,
            "mem_a": 500,
            "mem_b": n_mem - 500,
            "death": 300,
            "profile": 150,
            "queries": 25,
            "backlog_unpaced": 400,
            "backlog_paced": 400,
            "cpu": 400,
        }
        groups: dict[str, list[cloning.Clone]] = {}
        t0 = time.monotonic()
        for key, count in plan.items():
            releases = [f"2026.03.03-{key.replace('_', '')}{n:05d}" for n in range(count)]
            groups[key] = cloning.clone_runs(template, template_text, tenant, requester, releases)
        self.say(f"{sum(plan.values())} paused runs cloned in {time.monotonic() - t0:.1f}s")

        # 5. pause_run against a bare to_json
        report["pause"] = [
            sdk.measure_pause(tenant, requester, turns, repeats)
            for turns, repeats in ((1, 40), (10, 30), (100, 10))
        ]
        self.say("pause_run measured")

        # 1b. the bare SDK doing the same work in-process
        bare = sdk.bare_resume_ms(template_text, 300, out_dir / "bare-effects.log")
        report["sdk_bare_resume_ms"] = stats.summary_ms(bare[20:])
        self.say(f"bare SDK resume p50 {report['sdk_bare_resume_ms']['p50']} ms")

        # Profile of the in-process resume path (the worker's code, without the task queue).
        if not options["skip_profile"]:
            chunk = groups["profile"]
            cloning.approve_in_bulk(chunk, approver, enqueue=False)
            t0 = time.monotonic()
            text = stats.profile(
                lambda: [resume(run_id=c.run_id, worker_id="profile") for c in chunk]
            )
            (out_dir / "profile-resume.txt").write_text(text)
            report["profile_resume_ms_each"] = round((time.monotonic() - t0) * 1000 / len(chunk), 2)
            report["profile_resume_statuses"] = cloning.statuses([c.run_id for c in chunk])
            self.say("resume path profiled")

        # Statements per resume (the worker's thread and its tools') and per pause.
        report.update(self.statements(groups["queries"], tenant, requester, approver))

        # 1 + 2. approve to completed over HTTP: 2 web processes, 2 workers, Redis channel layer,
        # and a webhook receiver subscribed to every event that never answers.
        self.notified()
        receiver = silent.SilentReceiver()
        receiver.subscribe(tenant, approver)
        webs = self.start_webs(procs)
        report.update(self.approve_over_http(procs, webs, groups["http"], tenant, approver))
        report["http_webhook_receiver"] = {
            "answers": "never",
            "connections_held": receiver.connections,
        }
        # The later parts measure resumes alone: the endpoint goes, with what it had pending.
        receiver.unsubscribe(tenant)
        receiver.close()

        # 8. the API: a caller hands over its pause to the same 2 web processes.
        report.update(self.api_submit(webs, tenant, requester, options))
        for _, proc in webs:
            procs.stop(proc)

        # 3 + 6. resume throughput with 1, 2 and 4 workers; worker memory.
        report.update(self.throughput(procs, groups, approver))

        # Where the host's CPU goes per resume, 2 workers.
        if cpu.available():
            report["resume_cpu"] = self.resume_cpu(procs, groups["cpu"], approver)

        # Deployment: two workers, one killed mid-stream.
        self.notified()
        report["worker_death"] = self.worker_death(procs, groups["death"], approver)

        # 4. queue and audit pages at 100k tickets / 300k events, beside the admin.
        report.update(self.pages(options, out_dir))

        # Resumes beside a fan-out backlog: the pages' events, none yet fanned out.
        report["resume_fan_out_backlog"] = self.backlog(procs, groups, approver)
        return report

    def notified(self) -> None:
        """Fan out what the set-up and the earlier parts committed, as the workers would have
        done by now, so that a part's workers fan out only the events of its own runs."""
        t0 = time.monotonic()
        events = 0
        while moved := catch_up(limit=1000):
            events += moved
        if events:
            self.say(
                f"notifications of {events} earlier events fanned out in {time.monotonic() - t0:.1f}s"
            )

    # --- statements per resume and per pause -------------------------------------------------

    def statements(self, clones, tenant, requester, approver) -> dict[str, Any]:
        cloning.approve_in_bulk(clones, approver, enqueue=False)
        warm, timed = clones[:5], clones[5:]
        for clone in warm:
            resume(run_id=clone.run_id, worker_id="statements")
        resumes = queries.per_call(
            [lambda c=c: resume(run_id=c.run_id, worker_id="statements") for c in timed]
        )
        paused = sdk.multi_turn_result(1)

        def pause():
            pause_run(
                paused,
                tenant=tenant,
                agent_key="release",
                agent_version="1",
                requested_by=requester,
            )

        for _ in range(3):
            pause()
        pauses = queries.per_call([pause] * 20)
        self.say(
            f"statements: {resumes['statements']} per resume, {pauses['statements']} per pause"
        )
        return {
            "resume_queries": resumes["statements"],
            "pause_queries": pauses["statements"],
            "queries_detail": {
                "resume": resumes,
                "resume_statuses": cloning.statuses([c.run_id for c in timed]),
                "pause": pauses,
            },
        }

    # --- 1 + 2 --------------------------------------------------------------------------------

    def web_env(self) -> dict[str, str]:
        redis_url = settings.REDIS_URL or ""
        # The API phase sends hundreds of requests a minute with one token: not the rate limit's
        # figure, so it stays out of the way.
        extra = {
            "APPROVALS_API_RATE_PER_MINUTE": "1000000",
            # The silent webhook receiver of the approve-to-completed part is on loopback.
            "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS": "1",
        }
        return database.subprocess_env(**extra, **({"REDIS_URL": redis_url} if redis_url else {}))

    def start_webs(self, procs) -> list[tuple[str, processes.Proc]]:
        return [processes.start_web(procs, self.web_env()) for _ in range(2)]

    def approve_over_http(self, procs, webs, clones, tenant, approver) -> dict[str, Any]:
        redis_url = settings.REDIS_URL or ""
        env = self.web_env()
        workers = [procs.start("worker", "worker", "--interval", "1", env=env) for _ in range(2)]
        clients = []
        for url, _ in webs:
            client = ConsoleClient(url)
            client.login(approver.username, PASSWORD)
            clients.append(client)
        time.sleep(2)  # the workers are up and listening
        heard = Completions(tenant.pk)
        decisions, completions, statuses = [], [], []
        # When each decision was sent, answered and its run heard finishing (the host's clock,
        # which the audit events' times are on too): where the time went (completions.phases).
        moments: list[tuple[int, float, float, float]] = []
        sessions_before = database.sessions_opened()
        try:
            for n, clone in enumerate(clones):
                client = clients[n % len(clients)]
                sent = time.time()
                t0 = time.perf_counter()
                status = client.decide(clone.ticket_id).status
                t1 = time.perf_counter()
                answered = time.time()
                statuses.append(status)
                try:
                    heard.finished(clone.run_id, timeout=30)
                except TimeoutError:
                    raise RuntimeError(
                        f"run {clone.run_id} not finished after 30s\n"
                        + "\n".join(p.tail() for p in workers)
                    ) from None
                t2 = time.perf_counter()
                moments.append((clone.run_id, sent, answered, time.time()))
                if not Run.objects.filter(
                    pk=clone.run_id, status=RunStatus.COMPLETED, effects__status="done"
                ).exists():
                    raise RuntimeError(f"run {clone.run_id} finished without completing its effect")
                decisions.append(t1 - t0)
                completions.append(t2 - t0)
        finally:
            heard.close()
        sessions_after = database.sessions_opened()
        warm = 20
        run_ids = [c.run_id for c in clones]
        result = {
            "approve_to_completed_ms": stats.summary_ms(completions[warm:]),
            "approve_to_completed_phases_ms": phases(moments[warm:]),
            "decision_ms": stats.summary_ms(decisions[warm:]),
            "http_statuses": {str(s): statuses.count(s) for s in set(statuses)},
            "http_runs": cloning.statuses(run_ids),
            "http_exactly_once": cloning.exactly_once(c.release for c in clones),
            "http_web_processes": len(webs),
            "http_workers": len(workers),
            "http_channel_layer": "redis" if redis_url else "in-memory",
            "db_connections_per_approval": round(
                (sessions_after - sessions_before) / len(clones), 2
            ),
        }
        for proc in workers:
            procs.stop(proc)
        self.say(
            f"approve to completed p50 {result['approve_to_completed_ms']['p50']} ms, "
            f"decision p50 {result['decision_ms']['p50']} ms"
        )
        return result

    # --- 8 ------------------------------------------------------------------------------------

    def api_submit(self, webs, tenant, requester, options) -> dict[str, Any]:
        """POST /api/v1/runs/paused, each with its own paused state: one at a time (latency),
        then from concurrent clients (throughput); pause_run in-process on the same kind of
        state beside them."""
        n_one, n_many = options["api_requests"], options["api_throughput_requests"]
        n_pause = min(40, n_one)
        t0 = time.monotonic()
        results = api_submit.paused_results(
            [f"2026.04.04-api{n:05d}" for n in range(n_one + n_many + n_pause)]
        )
        bodies = [api_submit.submit_body(r) for r in results[: n_one + n_many]]
        self.say(f"{len(results)} paused states made in {time.monotonic() - t0:.1f}s")
        secret = api_submit.bench_token(tenant, requester)
        urls = [url for url, _ in webs]
        warm = min(20, n_one // 5)
        one, statuses = api_submit.submit_one_at_a_time(urls, secret, bodies[:n_one])
        many = api_submit.submit_concurrently(
            urls, secret, bodies[n_one:], clients=options["api_clients"]
        )
        paused = api_submit.pause_run_seconds(tenant, requester, results[n_one + n_many :])
        pause_warm = min(5, n_pause // 5)
        result = {
            "api_submit_ms": stats.summary_ms(one[warm:]),
            "api_submit_per_s": many["per_s"],
            "api_pause_run_ms": stats.summary_ms(paused[pause_warm:]),
            "api_submit_detail": {
                "one_at_a_time": {
                    "requests": n_one,
                    "warmup": warm,
                    "web_processes": len(urls),
                    "statuses": {str(s): c for s, c in statuses.items()},
                },
                "concurrent": many,
                "pause_run_in_process": {"runs": n_pause, "warmup": pause_warm},
            },
        }
        result["api_submit_vs_pause_run_ratio"] = round(
            result["api_submit_ms"]["p50"] / result["api_pause_run_ms"]["p50"], 1
        )
        self.say(
            f"API submit p50 {result['api_submit_ms']['p50']} ms "
            f"(pause_run {result['api_pause_run_ms']['p50']} ms), "
            f"{result['api_submit_per_s']}/s with {many['clients']} clients"
        )
        return result

    # --- 3 + 6 --------------------------------------------------------------------------------

    def throughput(self, procs, groups, approver) -> dict[str, Any]:
        per_s: dict[str, float] = {}
        detail: dict[str, Any] = {}
        duplicates = 0
        for workers_n, key in ((2, "w2"), (4, "w4")):
            self.notified()
            chunk = groups[key]
            ids = [c.run_id for c in chunk]
            before = database.sessions_opened()
            # Run as in the approve-to-completed part and as deployed: DEBUG off (no query log),
            # warnings only, the Redis channel layer; started, and idle, before the runs are
            # approved, as a deployed worker is: a worker's start (its imports, its first
            # statements) is not a resume's cost, and started beside ready runs it would take a
            # core from the worker that started first.
            workers = [
                procs.start("worker", "worker", "--interval", "1", env=self.web_env())
                for _ in range(workers_n)
            ]
            if cpu.available():
                cpu.wait_idle(p.pid for p in workers)
            cloning.approve_in_bulk(chunk, approver)
            cloning.wait_finished(ids, timeout=300, procs=workers)
            after = database.sessions_opened()
            for proc in workers:
                procs.stop(proc)
            span = cloning.span_seconds(ids)
            once = cloning.exactly_once(c.release for c in chunk)
            duplicates += once["duplicates"]
            per_s[f"workers_{workers_n}"] = round(len(ids) / span, 1)
            detail[f"workers_{workers_n}"] = {
                "runs": len(ids),
                "seconds": round(span, 2),
                "statuses": cloning.statuses(ids),
                **once,
                "db_connections_per_resume": round((after - before) / len(ids), 2),
            }
            self.say(f"{workers_n} workers: {per_s[f'workers_{workers_n}']} resumes/s {once}")

        # One worker: 500 resumes, its RSS; then the rest (to 5,000 in all), its RSS again.
        self.notified()
        first, rest = groups["mem_a"], groups["mem_b"]
        worker = procs.start("worker", "worker", "--interval", "1", env=self.web_env())
        if cpu.available():
            cpu.wait_idle([worker.pid])
        else:
            time.sleep(0.5)
        rss_start = worker.rss_kib()
        cloning.approve_in_bulk(first, approver)
        cloning.wait_finished([c.run_id for c in first], timeout=300, procs=[worker])
        rss_500 = worker.rss_kib()
        span = cloning.span_seconds([c.run_id for c in first])
        per_s["workers_1"] = round(len(first) / span, 1)
        once_a = cloning.exactly_once(c.release for c in first)
        self.say(f"1 worker: {per_s['workers_1']} resumes/s; RSS {rss_500} KiB after 500")
        samples = [(500, rss_500)]
        step = 1000
        for start in range(0, len(rest), step):
            part = rest[start : start + step]
            cloning.approve_in_bulk(part, approver)
            # Closely: the later runs' rate spans the waits between their parts.
            cloning.wait_finished([c.run_id for c in part], timeout=600, procs=[worker], poll=0.05)
            samples.append((500 + start + len(part), worker.rss_kib()))
        rss_end = samples[-1][1]
        span_rest = cloning.span_seconds([c.run_id for c in rest])
        procs.stop(worker)
        once_b = cloning.exactly_once(c.release for c in rest)
        duplicates += once_a["duplicates"] + once_b["duplicates"]
        all_ids = [c.run_id for c in first + rest]
        detail["workers_1"] = {
            "runs": len(first),
            "seconds": round(span, 2),
            **once_a,
            "statuses": cloning.statuses([c.run_id for c in first]),
            "later_runs": len(rest),
            "later_per_s": round(len(rest) / span_rest, 1),
            "later": once_b,
        }
        growth = (rss_end - rss_500) / rss_500 * 100
        self.say(f"worker RSS {rss_500} -> {rss_end} KiB ({growth:+.1f} %)")
        return {
            "resume_per_s": per_s,
            "resume_detail": detail,
            "duplicate_effects": duplicates,
            "worker_rss_kib": {
                "start": rss_start,
                "after_500": rss_500,
                f"after_{len(all_ids)}": rss_end,
                "samples": samples,
            },
            "worker_rss_growth_pct": round(growth, 1),
            "worker_memory_statuses": cloning.statuses(all_ids),
        }

    # --- where the CPU goes ---------------------------------------------------------------------

    def resume_cpu(self, procs, chunk, approver) -> dict[str, Any]:
        """2 workers, started and idle first, resume the chunk: the host's CPU time per resume,
        split into the workers', PostgreSQL's and the rest's (devtools.bench.cpu), and how many
        resumes a second the cores could carry at that cost. The window holds the runs' approval
        (one bulk transaction of this process) and its looks every half second too."""
        self.notified()
        ids = [c.run_id for c in chunk]
        workers = [
            procs.start("worker", "worker", "--interval", "1", env=self.web_env()) for _ in range(2)
        ]

        def work() -> int:
            cloning.approve_in_bulk(chunk, approver)
            cloning.wait_finished(ids, timeout=300, procs=workers)
            return len(ids)

        try:
            cpu.wait_idle(p.pid for p in workers)
            result = cpu.split(work, [p.pid for p in workers])
        finally:
            for proc in workers:
                procs.stop(proc)
        once = cloning.exactly_once(c.release for c in chunk)
        result.update(
            workers_n=2,
            per_s=round(len(ids) / cloning.span_seconds(ids), 1),
            statuses=cloning.statuses(ids),
            **once,
        )
        self.say(f"CPU per resume, 2 workers: {result}")
        return result

    # --- resumes beside a fan-out backlog ------------------------------------------------------

    def backlog(self, procs, groups, approver) -> dict[str, Any]:
        """One worker resumes runs while its notifications pool catches up on the pages' events
        (300,000 by default, over 20 tenants, none yet fanned out), as after a worker was down:
        first with the pool unpaced (--notifications-share 1), then as deployed. Resumes a
        second, and how far the backlog fell from the worker's start to the last run's end."""
        result: dict[str, Any] = {}
        for key, share in (("unpaced", "1"), ("paced", None)):
            chunk = groups[f"backlog_{key}"]
            ids = [c.run_id for c in chunk]
            behind_before = _events_behind()
            cloning.approve_in_bulk(chunk, approver)
            args = ["--interval", "1", *(["--notifications-share", share] if share else [])]
            worker = procs.start("worker", "worker", *args, env=self.web_env())
            cloning.wait_finished(ids, timeout=600, procs=[worker])
            behind_after = _events_behind()
            procs.stop(worker)
            span = cloning.span_seconds(ids)
            once = cloning.exactly_once(c.release for c in chunk)
            result[key] = {
                "share": float(share) if share else worker_command.NOTIFICATIONS_SHARE,
                "runs": len(ids),
                "resumes_per_s": round(len(ids) / span, 1),
                # From the worker's start to the bench's look after the last run finished: a
                # little longer than the resumes' span, the same for both.
                "events_fanned_out": behind_before - behind_after,
                "events_behind_at_start": behind_before,
                "statuses": cloning.statuses(ids),
                **once,
            }
            self.say(f"fan-out backlog, {key}: {result[key]}")
        return result

    # --- several workers, one dies ------------------------------------------------------------

    def worker_death(self, procs, clones, approver) -> dict[str, Any]:
        env = database.subprocess_env(
            APPROVALS_LEASE_SECONDS="3",
            APPROVALS_REAPER_INTERVAL_SECONDS="1",
            **({"REDIS_URL": settings.REDIS_URL} if settings.REDIS_URL else {}),
        )
        ids = [c.run_id for c in clones]
        cloning.approve_in_bulk(clones, approver)
        victim = procs.start("worker", "worker", "--interval", "1", env=env)
        survivor = procs.start("worker", "worker", "--interval", "1", env=env)
        while cloning.finished_count(ids) < len(ids) // 3:
            time.sleep(0.01)
        procs.stop(victim, kill=True)
        killed_at = time.monotonic()
        # How long the survivor took after the kill: looked at closely.
        finished = cloning.wait_finished(ids, timeout=300, procs=[survivor], poll=0.05)
        procs.stop(survivor)
        once = cloning.exactly_once(c.release for c in clones)
        requeued = AuditEvent.objects.filter(action="run.requeued", run_id__in=ids).count()
        result = {
            "runs": len(ids),
            "killed_after_finished": len(ids) // 3,
            "seconds_to_finish_after_kill": round(finished - killed_at, 2),
            "statuses": cloning.statuses(ids),
            "requeued_by_reaper": requeued,
            **once,
        }
        self.say(f"worker killed: {result}")
        return result

    # --- 4 ------------------------------------------------------------------------------------

    def pages(self, options: dict, out_dir: Path) -> dict[str, Any]:
        users = get_user_model()
        tenants = [Tenant.objects.create(slug=f"t{n:02d}", name=f"Tenant {n}") for n in range(20)]
        requesters = [users.objects.create_user(f"dev{n}", password="x") for n in range(5)]
        viewer = users.objects.create_user("pages-admin", password="x")
        superuser = users.objects.create_superuser("bench-super", password="x")
        for tenant in tenants:
            Membership.objects.create(user=viewer, tenant=tenant, role=Role.ADMIN)
            for requester in requesters:
                Membership.objects.create(user=requester, tenant=tenant, role=Role.VIEWER)
        console = Client()
        console.force_login(viewer)
        admin = Client()
        admin.force_login(superuser)
        paths = {
            "queue": (console, "/"),
            "audit": (console, "/audit/"),
            "admin_ticket": (admin, "/admin/approvals/ticket/"),
            "admin_audit": (admin, "/admin/approvals/auditevent/"),
        }
        total_t, total_e = options["page_tickets"], options["page_events"]
        small_t, small_e = total_t // 100, total_e // 100
        t0 = time.monotonic()
        pages.load_page_data(
            tenants,
            requesters,
            tickets_per_tenant=small_t // 20,
            events_per_tenant=small_e // 20,
        )
        small = {
            key: pages.measure_page(client, path, repeats=10, warmup=2)
            for key, (client, path) in paths.items()
        }
        pages.load_page_data(
            tenants,
            requesters,
            tickets_per_tenant=(total_t - small_t) // 20,
            events_per_tenant=(total_e - small_e) // 20,
        )
        self.say(
            f"page data loaded in {time.monotonic() - t0:.0f}s: "
            f"{total_t} tickets, {total_e} events over 20 tenants"
        )
        full = {
            key: pages.measure_page(client, path, repeats=40, warmup=3)
            for key, (client, path) in paths.items()
        }
        # The next page (keyset cursor), the way a person pages through.
        profile_text = stats.profile(
            lambda: [console.get("/") for _ in range(20)] + [console.get("/audit/")]
        )
        (out_dir / "profile-pages.txt").write_text(profile_text)
        with connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN ANALYZE SELECT DISTINCT tool_name FROM approvals_ticket "
                "WHERE status = 'pending' AND tenant_id IN (SELECT id FROM approvals_tenant)"
            )
            explain = "\n".join(row[0] for row in cursor.fetchall())
        (out_dir / "explain-distinct.txt").write_text(explain)
        self.say(
            f"queue p50 {full['queue']['ms']['p50']} ms / {full['queue']['queries']} queries; "
            f"audit p50 {full['audit']['ms']['p50']} ms / {full['audit']['queries']} queries"
        )
        return {
            "queue_page_ms": full["queue"]["ms"],
            "audit_page_ms": full["audit"]["ms"],
            "admin_ticket_changelist_ms": full["admin_ticket"]["ms"],
            "admin_audit_changelist_ms": full["admin_audit"]["ms"],
            "queue_page_queries": full["queue"]["queries"],
            "audit_page_queries": full["audit"]["queries"],
            "admin_ticket_queries": full["admin_ticket"]["queries"],
            "admin_audit_queries": full["admin_audit"]["queries"],
            "queries_at_1pct": {k: v["queries"] for k, v in small.items()},
            "p50_ms_at_1pct": {k: v["ms"]["p50"] for k, v in small.items()},
            "audit_first_request_ms": full["audit"]["first_request_ms"],
            "queue_vs_admin_ratio": round(
                full["queue"]["ms"]["p50"] / full["admin_ticket"]["ms"]["p50"], 2
            ),
            "audit_vs_admin_ratio": round(
                full["audit"]["ms"]["p50"] / full["admin_audit"]["ms"]["p50"], 2
            ),
            "page_rows": {"tickets": total_t, "audit_events": total_e, "tenants": 20},
        }


def _events_behind() -> int:
    """Audit events committed and not yet fanned out, over every tenant."""
    behind = Tenant.objects.aggregate(
        behind=Sum(F("audit_seq") - Coalesce(F("fan_out_cursor__seq"), 0))
    )["behind"]
    return int(behind or 0)
