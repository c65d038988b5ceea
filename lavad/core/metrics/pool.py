"""Bin-packing quality of one pool over time (LAVA paper, section 2.3).

* empty hosts: time-weighted average of 100 x empty hosts / hosts up (and
  the mean number of non-empty hosts, to compare pools that grew on demand
  against one common size);
* utilisation: time-weighted average of used / capacity (cores, memory);
* stranding: periodic inflation simulations (``stranding.py``);
* hosts used: the peak number of non-empty hosts, and the pool size;
* placement failures, split into "may retry" and "final".

Recorded traces start with an empty cluster (VMs running before recording
began are missing), so averages skip a warm-up period after the first event;
the summary states the window it measured. Symmetrically, a trace's tail
after its last request is pure drain (the arrivals that would have followed
are missing too), so by default the window closes at the last request
(``until = "last_request"``; ``"trace_end"`` measures to the end of the
trace). The metrics have a random
generator of their own, so switching them on or off never changes a decision.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import ConfigDict, Field

from lavad.core.cluster import ClusterState
from lavad.core.metrics.stranding import StrandingSample, inflate_schedulable, most_common

CORES, MEMORY = 0, 1


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """The ``[metrics]`` table: the settings validate it with these constraints."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    warmup_s: Annotated[float, Field(ge=0)] = 86_400.0
    # At least a second of event time: a sample a second is already at most
    # two an event, and a denormal interval (5e-324) made the count of ticks
    # over a gap overflow (``_sample_ticks``).
    sample_interval_s: Annotated[float, Field(ge=1.0)] = 3_600.0
    stranding: bool = True
    until: Annotated[
        Literal["last_request", "trace_end"],
        Field(description="close the averaging window at the last request or at the trace end"),
    ] = "last_request"
    mix_window: Annotated[int, Field(ge=1)] = 10_000
    mix_max_shapes: Annotated[int, Field(ge=1)] = 32


@dataclass(frozen=True, slots=True)
class TimePoint:
    time: float
    hosts_up: int
    empty_hosts_pct: float
    cpu_util_pct: float
    memory_util_pct: float


@dataclass(slots=True)
class _Integral:
    seconds: float = 0.0
    empty_pct: float = 0.0
    hosts_used: float = 0.0
    cpu_util_pct: float = 0.0
    memory_util_pct: float = 0.0

    def totals(self) -> tuple[float, float, float, float, float]:
        """(seconds, empty, cpu, memory, hosts used): the order ``summary`` unpacks."""
        return (
            self.seconds,
            self.empty_pct,
            self.cpu_util_pct,
            self.memory_util_pct,
            self.hosts_used,
        )


@dataclass(slots=True)
class PoolMetrics:
    config: MetricsConfig
    rng: np.random.Generator
    start: float | None = None
    last: float | None = None
    requests: int = 0
    placed: int = 0
    unfit_retryable: int = 0
    unfit_final: int = 0
    hosts_added_on_demand: int = 0
    peak_hosts_used: int = 0
    integral: _Integral = field(default_factory=_Integral)
    series: list[TimePoint] = field(default_factory=list)
    stranding: list[StrandingSample] = field(default_factory=list)
    measure_from: float = 0.0
    _next_tick: float = 0.0
    # The last ``mix_window`` request shapes, a ring buffer; counted only when
    # a stranding sample needs the mix.
    _mix: list[tuple[float, float, float, float]] = field(default_factory=list)
    _mix_next: int = 0
    _stranded_version: tuple[int, int] = (-1, -1)
    # (time, *integral.totals()) as of the latest request.
    _at_last_request: tuple[float, float, float, float, float, float] | None = None

    def advance(self, cluster: ClusterState, now: float) -> None:
        """Account for the state having held from the previous event until ``now``."""
        if self.start is None:
            self.start = self.last = now
            self._next_tick = now
            self.measure_from = now + self.config.warmup_s
        last = self.last if self.last is not None else now
        if now <= last:
            return
        if self._next_tick < now:
            self._sample_ticks(cluster, now)
        begin = last if last > self.measure_from else self.measure_from
        up = cluster.hosts_up
        if now > begin and up:
            dt = now - begin
            acc = self.integral
            acc.seconds += dt
            acc.empty_pct += dt * 100.0 * cluster.hosts_empty / up
            acc.hosts_used += dt * (up - cluster.hosts_empty)
            used = cluster.used_total
            capacity = cluster.capacity_total
            if capacity[CORES]:
                acc.cpu_util_pct += dt * 100.0 * used[CORES] / capacity[CORES]
            if capacity[MEMORY]:
                acc.memory_util_pct += dt * 100.0 * used[MEMORY] / capacity[MEMORY]
        self.last = now

    def observe_request(self, demand: tuple[float, float, float, float], now: float) -> None:
        """Count a request (after ``advance(now)``); remember the integrals at it."""
        self.requests += 1
        self._at_last_request = (now, *self.integral.totals())
        mix = self._mix
        if len(mix) < self.config.mix_window:
            mix.append(demand)
        else:
            mix[self._mix_next] = demand
            self._mix_next = (self._mix_next + 1) % self.config.mix_window

    def observe_hosts_used(self, cluster: ClusterState) -> None:
        used = cluster.hosts_up - cluster.hosts_empty
        self.peak_hosts_used = max(used, self.peak_hosts_used)

    def _sample_ticks(self, cluster: ClusterState, now: float) -> None:
        """The samples due at ticks before ``now``, over a state that held since the last event.

        Bounded by work, not by the gap: the state is the same at every tick
        of the gap, so the first tick is sampled and, when there are more,
        the last one stands for the rest with their count as its weight. A
        time jump of centuries costs two samples (it used to cost one per
        hour of the jump: a record with time 1e20 hung the daemon).
        """
        interval = self.config.sample_interval_s
        first = self._next_tick
        count = max(1, math.ceil((now - first) / interval))
        if first + (count - 1) * interval >= now:  # rounding at an exact multiple
            count -= 1
        self._sample(cluster, first, 1)
        if count > 1:
            last = first + (count - 1) * interval
            # Ticks 1..count-1 of the gap; stranding counts those past the warm-up.
            past_warmup = count - max(1, math.ceil((self.measure_from - first) / interval))
            self._sample(cluster, last, past_warmup)
            self._next_tick = first + count * interval
        else:
            self._next_tick = first + interval

    def _sample(self, cluster: ClusterState, at: float, weight: int) -> None:
        if not cluster.hosts_up:
            return
        self.series.append(
            TimePoint(
                time=at,
                hosts_up=cluster.hosts_up,
                empty_hosts_pct=100.0 * cluster.hosts_empty / cluster.hosts_up,
                cpu_util_pct=_pct(cluster.used_total[CORES], cluster.capacity_total[CORES]),
                memory_util_pct=_pct(cluster.used_total[MEMORY], cluster.capacity_total[MEMORY]),
            )
        )
        if self.config.stranding and at >= self.measure_from and self._mix and weight > 0:
            previous = self.stranding[-1] if self.stranding else None
            version = (cluster.version, self.requests)
            if previous is not None and self._stranded_version == version:
                # Nothing changed since the last sample (long quiet spells in
                # traces spanning months): the same state strands the same.
                self.stranding.append(replace(previous, time=at, weight=weight))
            else:
                self.stranding.append(replace(self._strand(cluster, at), weight=weight))
                self._stranded_version = version

    def _strand(self, cluster: ClusterState, at: float) -> StrandingSample:
        shapes, weights = most_common(Counter(self._mix), self.config.mix_max_shapes)
        inflated = inflate_schedulable(cluster, shapes, weights, self.rng)
        left, before, capacity = inflated.left, inflated.before, inflated.capacity
        return StrandingSample(
            time=at,
            cpu_pct=_pct(left[CORES], capacity[CORES]),
            memory_pct=_pct(left[MEMORY], capacity[MEMORY]),
            free_cpu_pct=_pct(before[CORES], capacity[CORES]),
            free_memory_pct=_pct(before[MEMORY], capacity[MEMORY]),
        )

    def drop_samples_before(self, cutoff: float) -> int:
        """Drop the time series and stranding samples taken before ``cutoff``; how many.

        For a daemon, which runs for ever: a sample an hour is 8,760 a year,
        kept in memory and written into every snapshot. The latest stranding
        sample stays whatever its time: the next one may reuse it. Decisions
        never read samples, and the summary's means are integrals apart from
        stranding, which then covers the samples kept.
        """
        dropped = 0
        for samples in (self.series, self.stranding):
            old = bisect.bisect_left(samples, cutoff, key=lambda sample: sample.time)
            old = min(old, len(samples) - 1) if samples is self.stranding else old
            if old > 0:
                del samples[:old]
                dropped += old
        return dropped

    def summary(self, cluster: ClusterState, end: float) -> dict[str, Any]:
        self.advance(cluster, end)
        until, seconds, empty, cpu, memory, used = (end, *self.integral.totals())
        if self.config.until == "last_request" and self._at_last_request is not None:
            until, seconds, empty, cpu, memory, used = self._at_last_request
        strands = [s for s in self.stranding if s.time <= until]
        unfit = self.unfit_retryable + self.unfit_final
        return {
            "measured_from_s": self.measure_from,
            "measured_until_s": until,
            "measured_seconds": seconds,
            "measured_until": self.config.until,
            "warmup_s": self.config.warmup_s,
            "empty_hosts_pct": empty / seconds if seconds else None,
            # Time-weighted mean of non-empty hosts: with a pool that grew on
            # demand, empty hosts against a common pool size N follow as
            # 100 * (1 - hosts_used_mean / N) (see replay.on_common_pool).
            "hosts_used_mean": used / seconds if seconds else None,
            "cpu_util_pct": cpu / seconds if seconds else None,
            "memory_util_pct": memory / seconds if seconds else None,
            "stranded_cpu_pct": _weighted_mean([(s.cpu_pct, s.weight) for s in strands]),
            "stranded_memory_pct": _weighted_mean([(s.memory_pct, s.weight) for s in strands]),
            "stranding_samples": sum(s.weight for s in strands),
            "hosts_used_peak": self.peak_hosts_used,
            "hosts_up_end": cluster.hosts_up,
            "hosts_added_on_demand": self.hosts_added_on_demand,
            "requests": self.requests,
            "placed": self.placed,
            "placement_failures": unfit,
            "placement_failures_retryable": self.unfit_retryable,
            "placement_failures_final": self.unfit_final,
            "placement_failure_pct": 100.0 * unfit / self.requests if self.requests else 0.0,
        }


def _pct(part: float, whole: float) -> float:
    return 100.0 * float(part) / float(whole) if whole else 0.0


def _weighted_mean(values: list[tuple[float, int]]) -> float | None:
    if not values:
        return None
    samples, weights = zip(*values, strict=True)
    return float(np.average(samples, weights=weights))
