"""Autopilot's horizontal scaling from CPU utilisation (section 3.3).

The raw recommendation is ``n_r[t] = S_{tau in [t-T, t]}(sum_i r_i[tau]) / r*``:
a statistic (max or p95) of the job's total CPU usage over the horizon ``T``
(default 72 h), divided by the target average utilisation ``r*`` (both in
units of one task's CPU limit). It is then stabilised:

- deferred downscaling: ``n_s[t]`` is the maximum ``n_r`` of the last ``T_d``;
- defer small changes: a change smaller than ``small_change`` (relative to the
  current count) is ignored;
- limited growth: at most ``max_initializing`` x current tasks may be
  initialising (added within the last ``init_s``), so upscaling is rate-limited;
- slow decay: when the job has more tasks than ``n_s``, some are removed every
  step, so that the count halves over ``halving_s`` (default one hour).

Choices the paper leaves open, made here: the recommendation is rounded up
(``ceil``); small changes are measured against the current count; a task
counts as initialising for ``init_s`` (default 5 minutes) after it is added,
because our streams carry no health checks.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from lavad.models.argument_checks import require_at_least
from lavad.models.limits.histogram import HOUR_S, INTERVAL_S
from lavad.models.limits.window_max import WindowMax


@dataclass(frozen=True)
class HorizontalConfig:
    """Horizontal autoscaler parameters (the paper's defaults where it gives them)."""

    target_utilization: float = 0.7
    horizon_s: float = 72 * HOUR_S
    statistic: Literal["max", "p95"] = "max"
    downscale_delay_s: float = 48 * HOUR_S
    halving_s: float = HOUR_S
    small_change: float = 0.1
    max_initializing: float = 0.5
    init_s: float = INTERVAL_S
    min_replicas: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.statistic not in ("max", "p95"):
            raise ValueError(f"statistic must be 'max' or 'p95', got {self.statistic!r}")
        for name in ("horizon_s", "halving_s", "init_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.downscale_delay_s < 0:
            raise ValueError(f"downscale_delay_s must be >= 0, got {self.downscale_delay_s}")
        if not 0 <= self.small_change < 1:
            raise ValueError(f"small_change must be in [0, 1), got {self.small_change}")
        if not self.max_initializing > 0:
            raise ValueError(f"max_initializing must be > 0, got {self.max_initializing}")
        require_at_least(1, min_replicas=self.min_replicas)


class HorizontalScaler:
    """Replica count for one job, from its total CPU usage per 5-minute window."""

    def __init__(self, config: HorizontalConfig | None = None, replicas: int = 1) -> None:
        self.config = config if config is not None else HorizontalConfig()
        if replicas < self.config.min_replicas:
            raise ValueError(f"replicas must be >= min_replicas, got {replicas}")
        self.replicas = replicas
        self._usage = WindowMax(keep_values=self.config.statistic == "p95")
        self._raw = WindowMax()
        self._added: deque[tuple[float, int]] = deque()
        self.raw = replicas
        self.stabilized = replicas
        # The horizon's statistic of total usage behind ``raw`` (for explanations).
        self.usage_statistic = 0.0

    def observe(self, time: float, total_usage: float) -> int:
        """Learn one window's total usage (in task limits); the replica count from now on."""
        if not (math.isfinite(total_usage) and total_usage >= 0):
            raise ValueError(f"total_usage must be finite and >= 0, got {total_usage!r}")
        cfg = self.config
        usage = self._usage
        # (+ 0.0: a -0.0 would otherwise tie with 0.0 and the maximum's sign
        # depend on their order.)
        usage.add(time, total_usage + 0.0)
        usage.drop_through(time - cfg.horizon_s)
        if cfg.statistic == "max":
            stat = usage.max()
        else:
            values = np.fromiter(usage.kept_values(), dtype=np.float64, count=len(usage))
            stat = float(np.percentile(values, 95))
        self.usage_statistic = stat
        self.raw = max(cfg.min_replicas, math.ceil(stat / cfg.target_utilization - 1e-9))

        # Deferred downscaling: the largest raw recommendation of the last T_d.
        self._raw.add(time, self.raw)
        self._raw.drop_through(time - cfg.downscale_delay_s)
        self.stabilized = int(self._raw.max())

        n = self.replicas
        if abs(self.stabilized - n) <= cfg.small_change * n:
            return n  # defer small changes
        if self.stabilized > n:
            while self._added and self._added[0][0] <= time - cfg.init_s:
                self._added.popleft()
            initializing = sum(k for _, k in self._added)
            room = max(1, math.floor(cfg.max_initializing * n)) - initializing
            grow = min(self.stabilized - n, max(room, 0))
            if grow > 0:
                self._added.append((time, grow))
                self.replicas = n + grow
        else:
            # Slow decay: shrink by the factor that halves the count over halving_s.
            step = INTERVAL_S / cfg.halving_s
            keep = math.floor(n * 2.0 ** (-step))
            self.replicas = max(self.stabilized, min(keep, n - 1))
        return self.replicas
