"""Helpers of `manage.py bench`: the bench database, processes, clones, data and measures.

Nothing here is used by the console itself. The bench runs against its own PostgreSQL
database (its name must contain "bench"), dropped and recreated at the start of every run.
Each helper lives in one module:

- database: the bench database, connections opened, the environment of its children;
- clones: paused runs cloned from one real paused run, approved in bulk, their outcome;
- sdk: the same work done by the bare SDK; pause_run against a bare to_json;
- pages: the queue and audit pages over many tickets and audit events;
- stats: percentiles, millisecond summaries, profiles;
- report: the run's metadata and the table of measures against targets.
"""
