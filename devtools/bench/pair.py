"""Two checkouts side by side (`manage.py bench_pair OTHER`): the same requests, alternating
between a web process of each, on one host at one time.

The host's speed drifts between two runs of `make bench` by more than most changes (see
docs/PERFORMANCE.md); requests alternated between the two versions meet the same drift, so
their difference is the change's.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from devtools.bench import stats


def alternate(
    sides: Sequence[Callable[[int], float | None]], rounds: int, *, warm: int
) -> list[list[float]]:
    """Call every side once per round, `rounds` times, and return each side's seconds per call,
    without its first `warm` calls. The order turns each round (0, 1, then 1, 0), so neither
    side always follows the other. A side is called with the number of the call (0, 1, 2, ...
    over both sides), to pick its own input; a side that returns seconds measured them itself
    (a batch's, without what it waited for first), else the call is timed."""
    seconds: list[list[float]] = [[] for _ in sides]
    number = 0
    for round_ in range(rounds):
        order = range(len(sides)) if round_ % 2 == 0 else reversed(range(len(sides)))
        for side in order:
            started = time.perf_counter()
            measured = sides[side](number)
            elapsed = time.perf_counter() - started if measured is None else measured
            number += 1
            if round_ >= warm:
                seconds[side].append(elapsed)
    return seconds


def commit_of(root: Path) -> str:
    """The checkout's commit (short), with "+" when its tree has changes; "?" outside git."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "?"
    return commit + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def table(measures: dict[str, list[list[float]]], names: Sequence[str]) -> str:
    """A markdown table: one row per measure and side, its p50 / p95 / mean in ms, and the
    second side's p50 against the first's."""
    lines = [
        "| measure | checkout | n | p50 / p95 / mean (ms) | p50 / first's |",
        "|---|---|---|---|---|",
    ]
    for measure, per_side in measures.items():
        first = stats.summary_ms(per_side[0])["p50"]
        for name, seconds in zip(names, per_side, strict=True):
            s = stats.summary_ms(seconds)
            ratio = f"{s['p50'] / first:.3f}" if first else "-"
            lines.append(
                f"| {measure} | {name} | {s['n']} | {s['p50']} / {s['p95']} / {s['mean']} "
                f"| {ratio} |"
            )
    return "\n".join(lines)
