"""Helpers of `manage.py bench`: the bench database, processes, clones, data and measures.

Nothing here is used by the console itself. The bench runs against its own PostgreSQL
database (its name must contain "bench"), dropped and recreated at the start of every run.
The command reaches every helper through this package; each lives in one module:

- database: the bench database, connections opened, the environment of its children;
- clones: paused runs cloned from one real paused run, approved in bulk, their outcome;
- sdk: the same work done by the bare SDK; pause_run against a bare to_json;
- pages: the queue and audit pages over many tickets and audit events;
- stats: percentiles, millisecond summaries, profiles;
- report: the run's metadata and the table of measures against targets.
"""

from __future__ import annotations

from devtools.bench.clones import (
    TEMPLATE_RELEASE,
    Clone,
    approve_in_bulk,
    clone_runs,
    clone_state,
    exactly_once,
    finished_count,
    make_template,
    span_seconds,
    statuses,
    wait_finished,
)
from devtools.bench.database import (
    bench_database_name,
    recreate_database,
    sessions_opened,
    subprocess_env,
)
from devtools.bench.pages import load_page_data, measure_page
from devtools.bench.sdk import bare_resume_ms, measure_pause, multi_turn_result
from devtools.bench.stats import pct, profile, summary_ms

# Processes and start_web are used by the bench command through this package.
from devtools.processes import Proc, Processes, child_env, start_web

PASSWORD = "bench-pass-2026"

__all__ = [
    "PASSWORD",
    "TEMPLATE_RELEASE",
    "Clone",
    "Proc",
    "Processes",
    "approve_in_bulk",
    "bare_resume_ms",
    "bench_database_name",
    "child_env",
    "clone_runs",
    "clone_state",
    "exactly_once",
    "finished_count",
    "load_page_data",
    "make_template",
    "measure_page",
    "measure_pause",
    "multi_turn_result",
    "pct",
    "profile",
    "recreate_database",
    "sessions_opened",
    "span_seconds",
    "start_web",
    "statuses",
    "subprocess_env",
    "summary_ms",
    "wait_finished",
]
