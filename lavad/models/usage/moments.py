"""Per VM, the online mean and variance of its CPU and memory usage.

Each observation x arrives with weight 1; with a half-life H, every earlier
weight is multiplied by 2^(-dt / H) first, dt the event time elapsed since
the resource's previous observation, so the estimates follow a workload that
changes. West's weighted form of Welford's update keeps it numerically
stable (no sum of squares minus square of sums):

    W  <- d W,  W2 <- d^2 W2,  S <- d S          (d = 2^(-dt/H), 1 without decay)
    W' =  W + 1
    mean' = mean + (x - mean) / W'
    S' = S + (x - mean) (x - mean')

``variance`` is S / (W - W2 / W), unbiased for these (reliability) weights:
without decay W = W2 = n and it is numpy's ``var(ddof=1)``. ``population_variance``
is S / W, numpy's ``var(ddof=0)``. W^2 / W2 is the effective sample size.

The third and fourth central sums M3, M4 follow Pebay's (2008) pairwise
update with one new point of weight 1 (they decay like S):

    M4' = M4 + delta^4 W (W^2 - W + 1) / W'^3 + 6 delta^2 S / W'^2 - 4 delta M3 / W'
    M3' = M3 + delta^3 W (W - 1) / W'^2 - 3 delta S / W'

so each VM also has its third and fourth cumulants (population estimates
M3 / W and M4 / W - 3 (S / W)^2): they add over independent VMs, and the
Cornish-Fisher percentile of a host's sum reads them (``tail.py``).

Usage is a fraction of the VM's request, as ``UsageSample`` carries it; a
sample with raw per-sample values (``UsageStats.samples``) contributes each
of them, since those are the instantaneous usage the variance is about, and
otherwise contributes its interval mean.

State lives in numpy arrays indexed by a slot per VM (rows: resources), so an
update by VM id is O(1) and readers can take all VMs at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from lavad.models.arrays import FloatArray
from lavad.models.usage.drift import CusumDrift, DriftConfig
from lavad.streams.schema import UsageSample, UsageStats

USAGE_RESOURCES: Final = ("cpu", "memory")
CPU: Final = 0
MEMORY: Final = 1
N_USAGE: Final = len(USAGE_RESOURCES)


@dataclass(frozen=True, slots=True)
class UsageEstimate:
    """One VM's estimate for one resource, as fractions of its request."""

    mean: float
    variance: float
    population_variance: float
    samples: int
    effective_samples: float


class UsageMoments:
    """Online weighted mean and variance per VM and resource, O(1) per observation.

    With drift detection on (``enable_drift``), each usage event's CPU
    interval mean is first tested by the CUSUM of ``drift.py`` against the
    VM's CPU moments so far; a VM whose usage left its history restarts its
    CPU moments from its last ``reseed`` interval means (kept in a ring per
    slot), and its id is queued in ``drifted`` for the host's risk to be read
    again.
    """

    # Drift detection (None: off). Class defaults, so moments restored from a
    # snapshot taken before detection existed read as "off".
    drift: CusumDrift | None = None
    drifted: list[str] | None = None
    # How many VMs' moments the detector restarted (``enable_drift`` counts from 0).
    resets: int = 0

    def __init__(self, half_life_s: float | None = None, initial_slots: int = 64) -> None:
        if half_life_s is not None and not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError(f"half_life_s must be a positive number or None, got {half_life_s}")
        self.half_life_s = half_life_s
        # Decay per second of event time, as a natural log: d = exp(rate * dt).
        self._log_decay = -math.log(2.0) / half_life_s if half_life_s is not None else 0.0
        size = max(1, initial_slots)
        self.weight: FloatArray = np.zeros((N_USAGE, size))
        self.weight_sq: FloatArray = np.zeros((N_USAGE, size))
        self.mean: FloatArray = np.zeros((N_USAGE, size))
        self.spread: FloatArray = np.zeros((N_USAGE, size))
        self.third: FloatArray = np.zeros((N_USAGE, size))
        self.fourth: FloatArray = np.zeros((N_USAGE, size))
        self.last_time: FloatArray = np.full((N_USAGE, size), -np.inf)
        self.count: NDArray[np.int64] = np.zeros((N_USAGE, size), dtype=np.int64)
        self._slot: dict[str, int] = {}
        self._free: list[int] = list(range(size - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, vm_id: object) -> bool:
        return vm_id in self._slot

    def slot(self, vm_id: str) -> int | None:
        return self._slot.get(vm_id)

    # ------------------------------------------------------------- updating

    def observe(self, vm_id: str, resource: int, time: float, value: float) -> int:
        """Add one observation of ``resource`` for ``vm_id`` at event time ``time``.

        An observation older than the resource's latest is added without
        decaying anything (dt is clamped at 0): replays can interleave VMs,
        and weights must never grow.
        """
        if not math.isfinite(value):
            raise ValueError(f"usage of {vm_id!r} must be finite, got {value}")
        slot = self._slot.get(vm_id)
        if slot is None:
            slot = self._take_slot(vm_id)
        self._add(resource, slot, time, value)
        return slot

    def enable_drift(self, config: DriftConfig) -> None:
        """Test every VM's CPU usage for a change of regime from now on (off: nothing)."""
        if not config.enabled or self.drift is not None:
            return
        size = self.weight.shape[1]
        self.drift = CusumDrift(config, size)
        self.drifted = []
        self._recent_value: FloatArray = np.zeros((size, config.reseed))
        self._recent_time: FloatArray = np.zeros((size, config.reseed))
        # Interval means since the slot's last restart (the detector's warm-up).
        self._since_reset: NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        self.resets = 0

    def take_drifted(self) -> list[str]:
        """The VMs reset since the last call, in the order they were (each once)."""
        drifted = self.drifted
        if not drifted:
            return []
        self.drifted = []
        return list(dict.fromkeys(drifted))

    def observe_sample(self, sample: UsageSample) -> int:
        """Add a usage event's CPU (and memory, when it has any) observations."""
        slot = self._slot.get(sample.vm_id)
        if slot is None:
            slot = self._take_slot(sample.vm_id)
        if self.drift is not None:
            self._test_drift(sample.vm_id, slot, sample.time, sample.cpu.mean)
        self._add_stats(CPU, slot, sample.time, sample.cpu)
        if sample.memory is not None:
            self._add_stats(MEMORY, slot, sample.time, sample.memory)
        return slot

    def _test_drift(self, vm_id: str, slot: int, time: float, value: float) -> None:
        """Test the interval mean against the moments before it; restart them on a change.

        The ring then holds this reading too, so the restarted moments include
        the reading that revealed the change.
        """
        drift = self.drift
        if drift is None or not math.isfinite(value):
            return
        since = int(self._since_reset[slot])
        reset = drift.update_one(
            slot,
            value,
            float(self.mean[CPU, slot]),
            math.sqrt(self.variance_at(slot, CPU)),
            since,
        )
        reseed = drift.config.reseed
        cursor = since % reseed
        self._recent_value[slot, cursor] = value
        self._recent_time[slot, cursor] = time
        self._since_reset[slot] = since + 1
        if not reset:
            return
        kept = min(since + 1, reseed)
        # Oldest first, so the restarted moments decay as they would have.
        order = [(cursor - kept + 1 + i) % reseed for i in range(kept)]
        values = self._recent_value[slot, order].tolist()
        times = self._recent_time[slot, order].tolist()
        self._reset_resource(CPU, slot)
        for past_time, past_value in zip(times[:-1], values[:-1], strict=True):
            self._add(CPU, slot, past_time, past_value)
        # This reading is added by the caller, as every reading is.
        self._recent_value[slot, :kept] = values
        self._recent_time[slot, :kept] = times
        self._since_reset[slot] = kept
        self.resets += 1
        if self.drifted is not None:
            self.drifted.append(vm_id)

    def forget(self, vm_id: str) -> bool:
        """Drop a VM's state (it exited); False if it had none."""
        slot = self._slot.pop(vm_id, None)
        if slot is None:
            return False
        self._reset(slot)
        self._free.append(slot)
        return True

    def _add_stats(self, resource: int, slot: int, time: float, stats: UsageStats) -> None:
        if stats.samples:
            for value in stats.samples:
                self._add(resource, slot, time, value)
        else:
            self._add(resource, slot, time, stats.mean)

    def _add(self, resource: int, slot: int, time: float, value: float) -> None:
        weight = float(self.weight[resource, slot])
        weight_sq = float(self.weight_sq[resource, slot])
        spread = float(self.spread[resource, slot])
        third = float(self.third[resource, slot])
        fourth = float(self.fourth[resource, slot])
        last = float(self.last_time[resource, slot])
        if self._log_decay and weight and time > last:
            decay = math.exp(self._log_decay * (time - last))
            weight *= decay
            weight_sq *= decay * decay
            spread *= decay
            third *= decay
            fourth *= decay
        mean = float(self.mean[resource, slot])
        total = weight + 1.0
        delta = value - mean
        step = delta / total
        # Higher sums first: each reads the lower ones before this point.
        fourth += (
            delta * step**3 * weight * (weight * weight - weight + 1.0)
            + 6.0 * step * step * spread
            - 4.0 * step * third
        )
        third += delta * step * step * weight * (weight - 1.0) - 3.0 * step * spread
        mean += step
        spread += delta * (value - mean)
        self.weight[resource, slot] = total
        self.weight_sq[resource, slot] = weight_sq + 1.0
        self.mean[resource, slot] = mean
        self.spread[resource, slot] = spread
        self.third[resource, slot] = third
        self.fourth[resource, slot] = fourth
        if time > last:
            self.last_time[resource, slot] = time
        self.count[resource, slot] += 1

    # -------------------------------------------------------------- reading

    def samples(self, slot: int, resource: int) -> int:
        return int(self.count[resource, slot])

    def variance_at(self, slot: int, resource: int) -> float:
        """Unbiased weighted variance; 0 until the effective sample size exceeds 1."""
        weight = float(self.weight[resource, slot])
        if weight <= 0.0:
            return 0.0
        denominator = weight - float(self.weight_sq[resource, slot]) / weight
        # One observation (or decay so fast that only the latest counts)
        # says nothing about spread.
        if denominator <= 1e-12 * weight:
            return 0.0
        return max(float(self.spread[resource, slot]), 0.0) / denominator

    def cumulants_at(self, slot: int, resource: int) -> tuple[float, float]:
        """The third and fourth cumulants (population estimates); 0 without spread."""
        weight = float(self.weight[resource, slot])
        spread = float(self.spread[resource, slot])
        if weight <= 0.0 or spread <= 0.0:
            return 0.0, 0.0
        second = spread / weight
        third = float(self.third[resource, slot]) / weight
        fourth = float(self.fourth[resource, slot]) / weight - 3.0 * second * second
        return third, fourth

    def estimate(self, vm_id: str, resource: int) -> UsageEstimate | None:
        """The VM's estimate, or None if it never had an observation of ``resource``."""
        slot = self._slot.get(vm_id)
        if slot is None or not self.count[resource, slot]:
            return None
        weight = float(self.weight[resource, slot])
        weight_sq = float(self.weight_sq[resource, slot])
        return UsageEstimate(
            mean=float(self.mean[resource, slot]),
            variance=self.variance_at(slot, resource),
            population_variance=max(float(self.spread[resource, slot]), 0.0) / weight,
            samples=int(self.count[resource, slot]),
            effective_samples=weight * weight / weight_sq,
        )

    # ---------------------------------------------------------------- slots

    def _take_slot(self, vm_id: str) -> int:
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self._slot[vm_id] = slot
        return slot

    def _reset_resource(self, resource: int, slot: int) -> None:
        self.weight[resource, slot] = 0.0
        self.weight_sq[resource, slot] = 0.0
        self.mean[resource, slot] = 0.0
        self.spread[resource, slot] = 0.0
        self.third[resource, slot] = 0.0
        self.fourth[resource, slot] = 0.0
        self.last_time[resource, slot] = -np.inf
        self.count[resource, slot] = 0

    def _reset(self, slot: int) -> None:
        if self.drift is not None:
            self.drift.clear(slot)
            self._since_reset[slot] = 0
        self.weight[:, slot] = 0.0
        self.weight_sq[:, slot] = 0.0
        self.mean[:, slot] = 0.0
        self.spread[:, slot] = 0.0
        self.third[:, slot] = 0.0
        self.fourth[:, slot] = 0.0
        self.last_time[:, slot] = -np.inf
        self.count[:, slot] = 0

    def _grow(self) -> None:
        size = self.weight.shape[1]

        def widen(array: FloatArray, fill: float) -> FloatArray:
            grown: FloatArray = np.full((N_USAGE, 2 * size), fill, dtype=array.dtype)
            grown[:, :size] = array
            return grown

        self.weight = widen(self.weight, 0.0)
        self.weight_sq = widen(self.weight_sq, 0.0)
        self.mean = widen(self.mean, 0.0)
        self.spread = widen(self.spread, 0.0)
        self.third = widen(self.third, 0.0)
        self.fourth = widen(self.fourth, 0.0)
        self.last_time = widen(self.last_time, -np.inf)
        count: NDArray[np.int64] = np.zeros((N_USAGE, 2 * size), dtype=np.int64)
        count[:, :size] = self.count
        self.count = count
        if self.drift is not None:
            self.drift.ensure(2 * size)
            reseed = self.drift.config.reseed
            for name in ("_recent_value", "_recent_time"):
                ring: FloatArray = np.zeros((2 * size, reseed))
                ring[:size] = getattr(self, name)
                setattr(self, name, ring)
            since: NDArray[np.int64] = np.zeros(2 * size, dtype=np.int64)
            since[:size] = self._since_reset
            self._since_reset = since
        self._free = list(range(2 * size - 1, size - 1, -1))
