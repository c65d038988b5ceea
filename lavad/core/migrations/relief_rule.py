"""When a GPA host has broken its overflow promise: an exact one-sided binomial test.

GPA promises, per host and usage window, P(usage > capacity) <= rho. Each
host keeps the outcomes of its last ``recent_windows`` scored windows
(overflowed or not). If the promise holds, the number K of overflows among
the n windows it has kept is at most Binomial(n, rho) (stochastically: each
window overflows with probability <= rho). The host is due for relief
(``relief.py``) when its k overflows reject that promise at level ``alpha``:

    P(Binomial(n, rho) >= k) <= alpha.

``overflows_needed(n, rho, alpha)`` is the smallest such k, and at least 2,
so a single unlucky window never moves a VM whatever alpha. Worked example:
at rho = 0.01 over n = 288 windows (a day of 5-minute windows), K has mean
2.88 and P(K >= 8) = 0.0091 while P(K >= 7) = 0.027, so at alpha = 0.01 the
host is relieved at its 8th overflow of the day. Right after its outcomes
were cleared (a relief changed its mix) fewer windows are kept and fewer
overflows suffice (2 in a row at rho = 0.01: probability 1e-4). Windows of
one host are not independent (bursts), so alpha is the false-alarm rate only
for a host whose overflows come one at a time; a burst counts as several.

Pure arithmetic and a bounded ring per host: the live GPA hooks and the
time-aligned evaluation (``evaluation/gpa_react.py``) call the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict, Field

from lavad.core.cluster import BoolArray
from lavad.core.input_bounds import MIN_CHECK_INTERVAL_S
from lavad.models.usage.drift import DriftConfig

# Fewest overflows that can ever relieve a host: one window is never evidence.
MIN_OVERFLOWS = 2


@dataclass(frozen=True, slots=True)
class ReliefConfig:
    """When GPA hosts are relieved: the ``[migrations.relief]`` table (off unless enabled).

    Only a pool placed by ``gpa`` can be relieved (its hooks score the windows).
    """

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: Annotated[
        bool, Field(description="relieve GPA hosts whose realised overflows reject rho")
    ] = False
    recent_windows: Annotated[
        # The ring is hosts x recent_windows bytes: two weeks of 5-minute
        # windows at most (10,000 hosts: 200 MB).
        int, Field(ge=2, le=20_160, description="usage windows kept per host for the test")
    ] = 288
    alpha: Annotated[
        float,
        Field(gt=0, lt=0.5, description="level of the one-sided binomial test of the promise"),
    ] = 0.01
    max_moves: Annotated[int, Field(ge=1, le=1000, description="VMs moved per relief at most")] = 8
    check_interval_s: Annotated[
        float,
        Field(
            ge=MIN_CHECK_INTERVAL_S,
            description="event time between looks for hosts due for relief",
        ),
    ] = 300.0

    drift: DriftConfig = field(default_factory=DriftConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.drift, DriftConfig):
            raise ValueError(f"drift must be a DriftConfig, got {type(self.drift).__name__}")
        if not 2 <= self.recent_windows <= 20_160:
            raise ValueError(f"recent_windows must be in [2, 20160], got {self.recent_windows}")
        if not (math.isfinite(self.alpha) and 0.0 < self.alpha < 0.5):
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if not 1 <= self.max_moves <= 1000:
            raise ValueError(f"max_moves must be in [1, 1000], got {self.max_moves}")
        if not (
            math.isfinite(self.check_interval_s) and self.check_interval_s >= MIN_CHECK_INTERVAL_S
        ):
            raise ValueError(
                f"check_interval_s must be >= {MIN_CHECK_INTERVAL_S:g}, got {self.check_interval_s}"
            )


def relief_drift(config: ReliefConfig) -> DriftConfig:
    """The config's drift detection; off for a config restored from a snapshot without it."""
    drift = getattr(config, "drift", None)
    return drift if isinstance(drift, DriftConfig) else DriftConfig(detector="off")


def promise_rejected(overflows: int, windows: int, rho: float, alpha: float) -> bool:
    """Whether ``overflows`` in ``windows`` reject P(overflow) <= rho at level alpha."""
    if windows < 0 or not 0 <= overflows <= windows:
        raise ValueError(f"need 0 <= overflows <= windows, got {overflows} of {windows}")
    return overflows >= overflows_needed(windows, rho, alpha)


def overflows_needed(windows: int, rho: float, alpha: float) -> int:
    """The fewest overflows in ``windows`` that reject the promise (windows + 1: none can)."""
    if windows < 0:
        raise ValueError(f"windows must be >= 0, got {windows}")
    return int(overflow_thresholds(windows, rho, alpha)[windows])


@lru_cache(maxsize=64)
def overflow_thresholds(max_windows: int, rho: float, alpha: float) -> NDArray[np.int64]:
    """``overflows_needed(n, rho, alpha)`` for every n in [0, max_windows], in one pass.

    The smallest k with P(K >= k) = sf(k - 1) <= alpha comes from the
    binomial's inverse survival function, vectorised over n (C work linear
    in ``max_windows``, not a tail per n), then is checked against sf on
    both sides of it, so a rounding in the inverse's search cannot move the
    threshold. Read-only: the cached array is shared.
    """
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if max_windows < 0:
        raise ValueError(f"windows must be >= 0, got {max_windows}")
    # Imported here: scipy.stats costs the daemon's start-up about half a
    # second, and only a pool with relief on ever asks.
    from scipy.stats import binom  # noqa: PLC0415

    windows = np.arange(max_windows + 1)
    needed = binom.isf(alpha, windows, rho).astype(np.int64) + 1
    needed = np.where(binom.sf(needed - 1, windows, rho) <= alpha, needed, needed + 1)
    lower = (needed >= 2) & (binom.sf(needed - 2, windows, rho) <= alpha)
    needed = np.minimum(np.where(lower, needed - 1, needed), windows + 1)
    thresholds: NDArray[np.int64] = np.maximum(MIN_OVERFLOWS, needed)
    thresholds.flags.writeable = False
    return thresholds


class OverflowEvidence:
    """Per host column, the outcomes of its last ``recent_windows`` scored windows.

    A ring of booleans per host: O(1) per recorded outcome, memory bounded
    by hosts x recent_windows whatever the stream's length.
    """

    def __init__(self, rho: float, config: ReliefConfig, initial_hosts: int = 16) -> None:
        if not 0.0 < rho < 1.0:
            raise ValueError(f"rho must be in (0, 1), got {rho!r}")
        self.rho = rho
        self.config = config
        size = max(1, initial_hosts)
        self._ring: NDArray[np.bool_] = np.zeros((size, config.recent_windows), dtype=np.bool_)
        self._cursor: NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        self.windows: NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        self.overflows: NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        self._needed = overflow_thresholds(config.recent_windows, rho, config.alpha)
        # Hosts found due and not relieved (cleared) since.
        self.pending: set[int] = set()

    def _ensure(self, hosts: int) -> None:
        size = len(self._cursor)
        if hosts <= size:
            return
        grown = max(hosts, 2 * size)
        ring = np.zeros((grown, self.config.recent_windows), dtype=np.bool_)
        ring[:size] = self._ring
        self._ring = ring
        for name in ("_cursor", "windows", "overflows"):
            array = np.zeros(grown, dtype=np.int64)
            array[:size] = getattr(self, name)
            setattr(self, name, array)

    def record(self, hosts: NDArray[np.int64], overflowed: BoolArray) -> NDArray[np.int64]:
        """One closed window's outcome for each of ``hosts`` (distinct); returns those due."""
        if not len(hosts):
            return np.empty(0, dtype=np.int64)
        self._ensure(int(hosts.max()) + 1)
        keep = self.config.recent_windows
        cursor = self._cursor[hosts]
        dropped = self._ring[hosts, cursor]
        full = self.windows[hosts] >= keep
        self.overflows[hosts] += overflowed.astype(np.int64) - (dropped & full).astype(np.int64)
        self.windows[hosts] = np.minimum(self.windows[hosts] + 1, keep)
        self._ring[hosts, cursor] = overflowed
        self._cursor[hosts] = (cursor + 1) % keep
        due = hosts[self.overflows[hosts] >= self._needed[self.windows[hosts]]]
        self.pending.update(due.tolist())
        return due

    def clear(self, host: int) -> None:
        """Forget a host's outcomes: its mix of VMs changed."""
        self.pending.discard(host)
        if host < len(self._cursor):
            self._ring[host] = False
            self._cursor[host] = 0
            self.windows[host] = 0
            self.overflows[host] = 0

    def due_hosts(self) -> list[int]:
        """The pending hosts the rule still finds due, ascending (the others leave)."""
        self.pending = {host for host in self.pending if self.due(host)}
        return sorted(self.pending)

    def due(self, host: int) -> bool:
        """Whether the host's kept outcomes reject the promise (the module's rule)."""
        if host >= len(self._cursor):
            return False
        return promise_rejected(
            int(self.overflows[host]), int(self.windows[host]), self.rho, self.config.alpha
        )
