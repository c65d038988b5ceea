"""Lavad's side against the actual side: the difference in empty hosts over time, with a CI.

Both sides sample their pool at the same ticks (``[metrics]
sample_interval_s`` from the pool's first event), so the difference is taken
tick by tick over the measured window (after the warm-up, up to where the
averages stop). Consecutive hourly differences are strongly correlated (a
host emptied now is still empty an hour later), so the interval is not the
naive one over samples: the window is cut into ``batches`` consecutive
batches (batch means), and the 95% interval is Student's t over those means.
With fewer than two samples per batch there is no interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final, Protocol

# Student's t, 0.975 quantile, by degrees of freedom 1..30 (beyond: 1.96).
_T975: Final = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
DEFAULT_BATCHES: Final = 10


class _Point(Protocol):
    @property
    def time(self) -> float: ...
    @property
    def empty_hosts_pct(self) -> float: ...


def t975(degrees: int) -> float:
    if degrees < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {degrees}")
    return _T975[degrees - 1] if degrees <= len(_T975) else 1.96


def difference_series(
    actual: Sequence[_Point], lavad: Sequence[_Point], start: float, until: float
) -> list[tuple[float, float]]:
    """(time, lavad - actual empty hosts pp) at the ticks both sides sampled in [start, until]."""
    theirs = {p.time: p.empty_hosts_pct for p in actual}
    return [
        (p.time, p.empty_hosts_pct - theirs[p.time])
        for p in lavad
        if start <= p.time <= until and p.time in theirs
    ]


def mean_with_ci(values: Sequence[float], batches: int = DEFAULT_BATCHES) -> dict[str, Any]:
    """Mean, and a 95% batch-means interval (None when too few values for the batches)."""
    n = len(values)
    if n == 0:
        return {"samples": 0, "mean": None, "ci95": None, "batches": 0, "batch_size": 0}
    mean = math.fsum(values) / n
    size = n // batches
    if batches < 2 or size < 2:
        return {"samples": n, "mean": mean, "ci95": None, "batches": 0, "batch_size": 0}
    # The first n % batches samples (the oldest) are left out of the batches.
    rest = values[n - size * batches :]
    means = [math.fsum(rest[i * size : (i + 1) * size]) / size for i in range(batches)]
    grand = math.fsum(means) / batches
    variance = math.fsum((m - grand) ** 2 for m in means) / (batches - 1)
    half = t975(batches - 1) * math.sqrt(variance / batches)
    return {
        "samples": n,
        "mean": mean,
        "ci95": [grand - half, grand + half],
        "batches": batches,
        "batch_size": size,
    }


def empty_hosts_difference(
    actual: Sequence[_Point],
    lavad: Sequence[_Point],
    start: float,
    until: float,
    batches: int = DEFAULT_BATCHES,
) -> dict[str, Any]:
    """Lavad minus actual empty hosts (pp of hosts up), sampled, with its 95% interval."""
    series = difference_series(actual, lavad, start, until)
    stats = mean_with_ci([d for _, d in series], batches)
    return {
        "mean_pp": stats["mean"],
        "ci95_pp": stats["ci95"],
        "samples": stats["samples"],
        "batches": stats["batches"],
        "batch_size": stats["batch_size"],
        "series": [{"time": t, "difference_pp": d} for t, d in series],
    }
