"""When a VM's usage leaves its history: a two-sided CUSUM on its standardised readings.

GPA reads a VM through the moments of everything it has used. When the VM
changes regime (a job that used 2% of its cores starts using 30%), those
moments keep predicting the old regime for as long as the old samples
outweigh the new ones: days. The detector here says when a VM's readings
have left what its own history shows, so its moments can forget the old
regime (``UsageMoments`` restarts them from the last ``reseed`` readings)
and its host's risk can be read again at once.

Each reading x of the VM (one per usage window: the interval mean) is
standardised by the VM's moments *before* x is added, z = (x - mu) / sigma,
clipped to [-clip, clip], and two sums run (Page's CUSUM):

    up   <- max(0, up   + z - allowance)
    down <- max(0, down - z - allowance)

and the VM is reset when either reaches ``threshold``. Why these choices:

* The allowance is large (3 sigma by default), not the textbook 0.5: usage
  is strongly autocorrelated (a diurnal cycle keeps z near +1 for hours),
  and a small allowance would add up a cycle the history already holds. A
  change is a level the history does not show, not a slow swing inside it.
* Each reading adds at most ``clip - allowance``; with ``clip = allowance +
  threshold / persistence`` fewer than ``persistence`` readings in a row can
  never reset a VM, however extreme (a burst is not a regime), and that many
  extreme readings always do. Worked by hand (``tests/test_drift.py``): a VM
  at mean 0.02, sigma 0.01 that steps to 0.30 (z = 28, clipped to 3 + 5/12)
  adds 5/12 per window and is reset at the 12th window of the new regime, an
  hour of 5-minute windows; its moments then restart from those 12 readings
  (``reseed``), all of the new regime.
* A reading is only tested once the VM has ``warmup`` readings since its
  last reset: a sigma from a handful of readings is noise. sigma is floored
  at ``min_sigma`` (a fraction of the request), so a VM that never changes
  (sigma 0) has z = 0 and is never reset.

O(1) per reading and two floats per VM: the daemon's per-sample budget. The
time-aligned evaluation runs the same update over a column of tasks
(``CusumDrift.update`` takes arrays).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict, Field

from lavad.models.arrays import FloatArray

DRIFT_DETECTORS: Final = ("off", "cusum")


@dataclass(frozen=True, slots=True)
class DriftConfig:
    """Per-VM regime-change detection (``[migrations.relief]``'s ``drift*`` keys)."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    detector: Annotated[
        Literal["off", "cusum"],
        Field(description="per-VM change detector on CPU usage: cusum, or off"),
    ] = "off"
    threshold: Annotated[
        float, Field(gt=0, le=1000, description="CUSUM sum, in sigmas, that resets a VM")
    ] = 5.0
    allowance: Annotated[
        float, Field(ge=0, le=100, description="sigmas a reading may stray before it counts")
    ] = 3.0
    persistence: Annotated[
        int,
        Field(
            ge=1,
            le=10_000,
            description="readings at the clip in a row that reset a VM (fewer never do)",
        ),
    ] = 12
    warmup: Annotated[
        int, Field(ge=2, le=100_000, description="readings since a reset before testing")
    ] = 48
    reseed: Annotated[
        int, Field(ge=1, le=1_000, description="recent readings the moments restart from")
    ] = 12
    min_sigma: Annotated[
        float, Field(gt=0, le=1, description="floor of sigma, as a fraction of the request")
    ] = 0.01

    def __post_init__(self) -> None:
        if self.detector not in DRIFT_DETECTORS:
            raise ValueError(
                f"detector must be one of {', '.join(DRIFT_DETECTORS)}, got {self.detector!r}"
            )
        if not (math.isfinite(self.threshold) and 0 < self.threshold <= 1000):
            raise ValueError(f"threshold must be in (0, 1000], got {self.threshold}")
        if not (math.isfinite(self.allowance) and 0 <= self.allowance <= 100):
            raise ValueError(f"allowance must be in [0, 100], got {self.allowance}")
        if not 1 <= self.persistence <= 10_000:
            raise ValueError(f"persistence must be in [1, 10000], got {self.persistence}")
        if not 2 <= self.warmup <= 100_000:
            raise ValueError(f"warmup must be in [2, 100000], got {self.warmup}")
        if not 1 <= self.reseed <= 1_000:
            raise ValueError(f"reseed must be in [1, 1000], got {self.reseed}")
        if self.reseed > self.warmup:
            raise ValueError(
                f"reseed ({self.reseed}) must be at most warmup ({self.warmup}): "
                "the moments restart from readings the detector has seen"
            )
        if not (math.isfinite(self.min_sigma) and 0 < self.min_sigma <= 1):
            raise ValueError(f"min_sigma must be in (0, 1], got {self.min_sigma}")

    @property
    def enabled(self) -> bool:
        return self.detector != "off"

    @property
    def clip(self) -> float:
        """The largest |z| a reading counts: ``persistence`` such readings in a row reach the
        threshold, fewer never do."""
        return self.allowance + self.threshold / self.persistence


class CusumDrift:
    """The two CUSUM sums per VM slot, and the reference each excursion is measured from.

    While a slot's sums are above 0 (an excursion is under way), z is taken
    against the moments as they stood when it began, not as they are: the
    excursion's own readings, added to the moments, would otherwise pull the
    mean and sigma towards them and hide the change (a VM with a short
    history would never be reset).
    """

    def __init__(self, config: DriftConfig, initial_slots: int = 64) -> None:
        self.config = config
        size = max(1, initial_slots)
        self.up: FloatArray = np.zeros(size)
        self.down: FloatArray = np.zeros(size)
        self.ref_mean: FloatArray = np.zeros(size)
        self.ref_sigma: FloatArray = np.zeros(size)

    def ensure(self, slots: int) -> None:
        size = len(self.up)
        if slots <= size:
            return
        grown = max(slots, 2 * size)
        for name in ("up", "down", "ref_mean", "ref_sigma"):
            array = np.zeros(grown)
            array[:size] = getattr(self, name)
            setattr(self, name, array)

    def update(
        self,
        slots: NDArray[np.int64],
        values: FloatArray,
        mean: FloatArray,
        sigma: FloatArray,
        readings: NDArray[np.int64],
    ) -> NDArray[np.bool_]:
        """One reading per slot (``mean``, ``sigma``: the moments before it; ``readings``:
        readings since the slot's last reset, before this one); returns the slots to reset.

        The sums of the slots returned are zeroed: the caller restarts their moments.
        """
        config = self.config
        self.ensure(int(slots.max()) + 1 if len(slots) else 0)
        up, down = self.up[slots], self.down[slots]
        active = (up > 0.0) | (down > 0.0)
        reference = np.where(active, self.ref_mean[slots], mean)
        scale = np.where(active, self.ref_sigma[slots], np.maximum(sigma, config.min_sigma))
        z = np.clip((values - reference) / scale, -config.clip, config.clip)
        testing = readings >= config.warmup
        up = np.where(testing, np.maximum(0.0, up + z - config.allowance), 0.0)
        down = np.where(testing, np.maximum(0.0, down - z - config.allowance), 0.0)
        reset = (up >= config.threshold * _SLACK) | (down >= config.threshold * _SLACK)
        self.up[slots] = np.where(reset, 0.0, up)
        self.down[slots] = np.where(reset, 0.0, down)
        self.ref_mean[slots] = reference
        self.ref_sigma[slots] = scale
        return reset

    def update_one(self, slot: int, value: float, mean: float, sigma: float, readings: int) -> bool:
        """``update`` for one slot in plain floats (the daemon's per-sample path)."""
        config = self.config
        self.ensure(slot + 1)
        up, down = float(self.up[slot]), float(self.down[slot])
        if up > 0.0 or down > 0.0:
            reference, scale = float(self.ref_mean[slot]), float(self.ref_sigma[slot])
        else:
            reference, scale = mean, max(sigma, config.min_sigma)
        self.ref_mean[slot] = reference
        self.ref_sigma[slot] = scale
        if readings < config.warmup:
            self.up[slot] = self.down[slot] = 0.0
            return False
        z = min(config.clip, max(-config.clip, (value - reference) / scale))
        up = max(0.0, up + z - config.allowance)
        down = max(0.0, down - z - config.allowance)
        reset = up >= config.threshold * _SLACK or down >= config.threshold * _SLACK
        self.up[slot] = 0.0 if reset else up
        self.down[slot] = 0.0 if reset else down
        return reset

    def clear(self, slot: int) -> None:
        if slot < len(self.up):
            self.up[slot] = 0.0
            self.down[slot] = 0.0


# ``persistence`` readings at the clip add threshold / persistence each; their
# float sum may fall an ulp short of the threshold, which must not cost a window.
_SLACK: Final = 1.0 - 1e-9
