"""The bench's report: where and when it ran, and its table of measures against targets."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

from django.conf import settings


def meta(name: str, seconds: float) -> dict[str, Any]:
    def run(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        except OSError:
            return ""

    mem = next(
        (
            line.split()[1]
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        "0",
    )
    return {
        "date": run("date", "-u").strip(),
        "commit": run("git", "rev-parse", "--short", "HEAD").strip(),
        "nproc": run("nproc").strip(),
        "mem_total_gib": round(int(mem) / 1024 / 1024, 1),
        "python": platform.python_version(),
        "database": name,
        "redis": bool(settings.REDIS_URL),
        "seconds": round(seconds, 1),
    }


# pause_run over a bare to_json of the same result, by the state's turns.
PAUSE_TARGETS = {10: 3, 100: 2}


def ok(flag: bool) -> str:
    return "met" if flag else "MISSED"


def trio(s: dict) -> str:
    return f"{s['p50']} / {s['p95']} / {s['p99']}"


def table(r: dict[str, Any]) -> str:
    """The measures of the run as a Markdown table: the console's (a whole run) and the API's
    (a whole run, or --only-api)."""
    rows = [("measure", "p50 / p95 / p99 or value", "target", "verdict")]
    if "pause" in r:
        rows += _console_rows(r)
    if "api_submit_ms" in r:
        rows += _api_rows(r)
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    lines = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines) + "\n"


def _api_rows(r: dict[str, Any]) -> list[tuple]:
    many = r["api_submit_detail"]["concurrent"]
    ratio, per_s = r["api_submit_vs_pause_run_ratio"], r["api_submit_per_s"]
    return [
        ("API: POST /runs/paused, one at a time (ms)", trio(r["api_submit_ms"]), "-", "-"),
        ("pause_run in-process, same states (ms)", trio(r["api_pause_run_ms"]), "-", "-"),
        ("API submit / pause_run (p50)", ratio, "<= 2", ok(ratio <= 2)),
        (
            f"API submits/s, {many['clients']} clients, {many['web_processes']} web",
            per_s,
            ">= 100",
            ok(per_s >= 100),
        ),
    ]


def _console_rows(r: dict[str, Any]) -> list[tuple]:
    pause = {p["turns"]: p for p in r["pause"]}
    # The headline is the worst of the three sizes; each size is beside it.
    r["pause_vs_to_json_ratio"] = max(v["ratio_p50"] for v in pause.values())
    r["pause_vs_to_json_ratio_by_turns"] = {f"turns_{k}": v["ratio_p50"] for k, v in pause.items()}
    r["blob_vs_json_ratio_10_turns"] = pause[10]["blob_vs_json"]
    r["blob_vs_json_ratio"] = {f"turns_{k}": v["blob_vs_json"] for k, v in pause.items()}
    a2c, dec, bare = r["approve_to_completed_ms"], r["decision_ms"], r["sdk_bare_resume_ms"]
    r["approve_vs_bare_sdk_ratio"] = round(a2c["p50"] / bare["p50"], 1)
    q, au = r["queue_page_ms"], r["audit_page_ms"]
    aq, aa = r["admin_ticket_changelist_ms"], r["admin_audit_changelist_ms"]
    rows = [
        (
            "approve to completed (ms)",
            trio(a2c),
            "p50 <= 50, p99 <= 150",
            ok(a2c["p50"] <= 50 and a2c["p99"] <= 150),
        ),
        ("bare SDK resume in-process (ms)", trio(bare), "-", "-"),
        (
            "approve to completed / bare SDK (p50)",
            r["approve_vs_bare_sdk_ratio"],
            "<= 4",
            ok(r["approve_vs_bare_sdk_ratio"] <= 4),
        ),
        (
            "statements per resume (worker + tools)",
            r["resume_queries"],
            "<= 6",
            ok(r["resume_queries"] <= 6),
        ),
        ("statements per pause", r["pause_queries"], "<= 8", ok(r["pause_queries"] <= 8)),
        ("decision request (ms)", trio(dec), "p50 <= 15", ok(dec["p50"] <= 15)),
        ("resumes/s, 1 worker", r["resume_per_s"]["workers_1"], "-", "-"),
        (
            "resumes/s, 2 workers",
            r["resume_per_s"]["workers_2"],
            ">= 100",
            ok(r["resume_per_s"]["workers_2"] >= 100),
        ),
        ("resumes/s, 4 workers", r["resume_per_s"]["workers_4"], "-", "-"),
        (
            "duplicate effects (all phases)",
            r["duplicate_effects"],
            "0",
            ok(r["duplicate_effects"] == 0),
        ),
        ("queue page, 100k tickets (ms)", trio(q), "p95 <= 30", ok(q["p95"] <= 30)),
        ("admin ticket change list (ms)", trio(aq), "-", "-"),
        (
            "queue / admin (p50)",
            r["queue_vs_admin_ratio"],
            "<= 0.5",
            ok(r["queue_vs_admin_ratio"] <= 0.5),
        ),
        ("audit page, 300k events (ms)", trio(au), "p95 <= 30", ok(au["p95"] <= 30)),
        ("admin audit change list (ms)", trio(aa), "-", "-"),
        (
            "audit / admin (p50)",
            r["audit_vs_admin_ratio"],
            "<= 0.5",
            ok(r["audit_vs_admin_ratio"] <= 0.5),
        ),
        (
            "queries: queue / audit (1% data -> full)",
            f"{r['queries_at_1pct']['queue']}->{r['queue_page_queries']} / "
            f"{r['queries_at_1pct']['audit']}->{r['audit_page_queries']}",
            "<= 8, constant",
            ok(
                max(r["queue_page_queries"], r["audit_page_queries"]) <= 8
                and r["queries_at_1pct"]["queue"] == r["queue_page_queries"]
                and r["queries_at_1pct"]["audit"] == r["audit_page_queries"]
            ),
        ),
    ]
    for turns, p in pause.items():
        rows.append(
            (
                f"pause_run / to_json, {turns} turns (p50)",
                f"{p['ratio_p50']} ({p['pause_run_ms']['p50']} / {p['to_json_ms']['p50']} ms)",
                f"<= {PAUSE_TARGETS[turns]}" if turns in PAUSE_TARGETS else "-",
                ok(p["ratio_p50"] <= PAUSE_TARGETS[turns]) if turns in PAUSE_TARGETS else "-",
            )
        )
        rows.append(
            (
                f"blob / raw JSON, {turns} turns",
                f"{p['blob_vs_json']} ({p['blob_bytes']} / {p['raw_json_bytes']} B)",
                "<= 0.3 from 10 turns" if turns >= 10 else "-",
                ok(p["blob_vs_json"] <= 0.3) if turns >= 10 else "-",
            )
        )
    rss = r["worker_rss_kib"]
    rows.append(
        (
            "worker RSS 500 -> 5,000 resumes",
            f"{rss['after_500']} -> {rss['samples'][-1][1]} KiB ({r['worker_rss_growth_pct']:+} %)",
            "< 10 %",
            ok(r["worker_rss_growth_pct"] < 10),
        )
    )
    if "resume_fan_out_backlog" in r:
        b = r["resume_fan_out_backlog"]
        u, p = b["unpaced"], b["paced"]
        rows.append(
            (
                "resumes/s beside a fan-out backlog, 1 worker: unpaced / paced",
                f"{u['resumes_per_s']} / {p['resumes_per_s']} (events fanned out "
                f"{u['events_fanned_out']} / {p['events_fanned_out']}; dup "
                f"{u['duplicates'] + p['duplicates']}, lost {u['lost'] + p['lost']})",
                "none duplicated or lost",
                ok(u["duplicates"] + p["duplicates"] + u["lost"] + p["lost"] == 0),
            )
        )
    if "resume_cpu" in r:
        c = r["resume_cpu"]
        rows.append(
            (
                "host CPU per resume, 2 workers (ms): workers / PostgreSQL / rest",
                f"{c['host_busy_ms']}: {c['workers_ms']} / {c['postgres_ms']} / {c['other_ms']} "
                f"({c['per_s']}/s, cores {int(c['busy_share'] * 100)} % busy, ceiling "
                f"{c['ceiling_per_s']}/s on {c['cores']}; dup {c['duplicates']}, lost {c['lost']})",
                "none duplicated or lost",
                ok(c["duplicates"] + c["lost"] == 0),
            )
        )
    d = r["worker_death"]
    rows.append(
        (
            "2 workers, one SIGKILLed",
            f"{d['statuses']}, dup {d['duplicates']}, lost {d['lost']}, "
            f"requeued {d['requeued_by_reaper']}",
            "no duplicate",
            ok(d["duplicates"] == 0),
        )
    )
    return rows
