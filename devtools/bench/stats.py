"""Percentiles, millisecond summaries and profiles of the bench's measures."""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
from collections.abc import Callable, Iterable
from typing import Any

# --- statistics -------------------------------------------------------------------------------


def pct(values: Iterable[float], q: float) -> float:
    data = sorted(values)
    if not data:
        return float("nan")
    rank = (len(data) - 1) * q
    low = int(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def summary_ms(seconds: Iterable[float]) -> dict[str, float]:
    data = [s * 1000 for s in seconds]
    return {
        "n": len(data),
        "p50": round(pct(data, 0.50), 2),
        "p95": round(pct(data, 0.95), 2),
        "p99": round(pct(data, 0.99), 2),
        "mean": round(statistics.fmean(data), 2) if data else float("nan"),
        "max": round(max(data), 2) if data else float("nan"),
    }


# --- profiles ---------------------------------------------------------------------------------


def profile(fn: Callable[[], Any], *, top: int = 25) -> str:

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        fn()
    finally:
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    out.write("\n--- by own time ---\n")
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()
