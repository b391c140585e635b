"""Where the host's CPU goes while workers resume: every process's CPU time, read from /proc
(Linux), before and after, split into the workers, PostgreSQL and the rest."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def available() -> bool:
    return (PROC / "stat").is_file()


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def process_seconds(pid: int) -> float:
    """The CPU time (user and system, all its threads) of a process; 0 when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0.0
    # The command sits in parentheses and may hold spaces: the fields follow the last ")".
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _ticks()


def host_seconds() -> tuple[float, float]:
    """The CPU time of every core since boot: (all, not this host's work: idle, waiting on I/O,
    and stolen by the hypervisor). The guests' time is already in user and nice."""
    values = [int(v) for v in (PROC / "stat").read_text().splitlines()[0].split()[1:9]]
    return sum(values) / _ticks(), (values[3] + values[4] + values[7]) / _ticks()


def snapshot() -> dict[int, tuple[str, float]]:
    """Every process now: pid -> (command name, CPU seconds)."""
    found = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                name = (entry / "comm").read_text().strip()
            except OSError:
                continue
            found[int(entry.name)] = (name, process_seconds(int(entry.name)))
    return found


def wait_idle(pids: Iterable[int], *, quiet: float = 0.02, timeout: float = 60) -> None:
    """Wait until the processes have stopped taking CPU (a worker's start-up done): less than
    `quiet` seconds of CPU between two looks a second apart."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    last = sum(process_seconds(p) for p in pids)
    while time.monotonic() < deadline:
        time.sleep(1)
        now = sum(process_seconds(p) for p in pids)
        if now - last < quiet:
            return
        last = now


def split(work: Callable[[], int], workers: Iterable[int]) -> dict[str, Any]:
    """Run work() (which returns how many resumes it waited for) and say where the host's CPU
    went meanwhile, per resume: the workers (their processes, every thread), PostgreSQL (every
    process named postgres that lived to the end: the backends the workers use, the server's
    own), and the rest of the host's busy time (every other process, this one's own work in the
    window included, those that ended in it, the kernel's). busy_share: how much of all the
    cores' time was taken. Raises ValueError when work() waited for no resume."""
    workers = set(workers)
    before, (all_before, idle_before) = snapshot(), host_seconds()
    started = time.monotonic()
    resumes = work()
    if resumes <= 0:
        raise ValueError("no resume to share the CPU time among")
    seconds = time.monotonic() - started
    after, (all_after, idle_after) = snapshot(), host_seconds()
    spent = {"workers": 0.0, "postgres": 0.0}
    for pid, (name, cpu) in after.items():
        key = "workers" if pid in workers else "postgres" if name == "postgres" else None
        if key is not None:
            spent[key] += max(cpu - before.get(pid, (name, 0.0))[1], 0.0)
    busy = (all_after - all_before) - (idle_after - idle_before)
    spent["other"] = max(busy - spent["workers"] - spent["postgres"], 0.0)
    cores = os.cpu_count() or 1
    per = 1000 / resumes
    return {
        "resumes": resumes,
        "seconds": round(seconds, 2),
        "cores": cores,
        "host_busy_ms": round(busy * per, 2),
        **{f"{key}_ms": round(value * per, 2) for key, value in spent.items()},
        "busy_share": round(busy / max(all_after - all_before, 1e-9), 2),
        # How many resumes a second all the cores could carry at that cost, fully busy.
        "ceiling_per_s": round(cores * 1000 / max(busy * per, 1e-9), 1),
    }
