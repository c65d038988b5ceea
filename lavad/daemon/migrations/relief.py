"""Relief of GPA hosts that break their overflow promise: when, which VMs, and where.

GPA promises, per host and usage window, P(usage > capacity) <= rho. A
packing made once cannot keep that promise through a change of regime the
history never showed (a VM whose usage jumps 17x); a live pool can react.

**When.** Each host keeps the outcomes of its last ``recent_windows`` scored
windows (overflowed or not). If the promise holds, the number K of overflows
among the n windows it has kept is at most Binomial(n, rho) (stochastically:
each window overflows with probability <= rho). The host is relieved when
that promise is rejected by the exact one-sided binomial test at level
``alpha``: when its k overflows satisfy

    P(Binomial(n, rho) >= k) <= alpha.

``overflows_needed(n, rho, alpha)`` is the smallest such k (at least 2, so a
single unlucky window never moves a VM, whatever alpha). Worked example: at
rho = 0.01 over n = 288 windows (a day of 5-minute windows), K has mean
2.88 and P(K >= 8) = 0.0091 while P(K >= 7) = 0.027, so at alpha = 0.01 the
host is relieved at its 8th overflow of the day. Windows of one host are
not independent (bursts), so alpha is the false-alarm rate only for a
host whose overflows come one at a time; a burst counts as several. After a
relief the source's and the targets' kept outcomes are cleared: they were
evidence about a mix of VMs that no longer exists.

**Which VMs, where.** The source's VMs are read with their *current*
moments (mean, variance, third and fourth cumulants) through the pool's
current percentile method and margin: a host's load is
mu + margin x factor(method) x sigma, GPA's fit test as the placement uses
it. VMs leave one at a time, each time the one whose departure lowers the
host's load most (the largest excess first), until the host passes the fit
test. The first always leaves: the realised overflows have already shown
the moments to be wrong. Each goes to the open host where the fit test
with it added passes and whose standardised headroom is then smallest
(GPA Best Fit), or to a new empty host when none accepts it; a VM that is
alone on the source stays (it would overflow anywhere alone). Work per
relief: at most ``max_moves`` VMs, each against every host once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

import numpy as np
from numpy.typing import NDArray
from pydantic import ConfigDict, Field
from scipy.stats import binom

from lavad.daemon.cluster import BoolArray, FloatArray
from lavad.daemon.placement.gpa import gpa_fits, quantile_factor, standardized_headroom
from lavad.models.usage.tail import PERCENTILE_METHODS, effective_variance

# Rows of a terms array: the additive cumulant sums of a host or a VM.
MEAN_ROW, VARIANCE_ROW, THIRD_ROW, FOURTH_ROW = 0, 1, 2, 3
TERMS = 4
# Fewest overflows that can ever relieve a host: one window is never evidence.
MIN_OVERFLOWS = 2


@dataclass(frozen=True, slots=True)
class ReliefConfig:
    """When GPA hosts are relieved: the ``[migrations.relief]`` table (off unless enabled)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    enabled: Annotated[
        bool, Field(description="relieve GPA hosts whose realised overflows reject rho")
    ] = False
    recent_windows: Annotated[
        int, Field(ge=2, le=100_000, description="usage windows kept per host for the test")
    ] = 288
    alpha: Annotated[
        float,
        Field(gt=0, lt=0.5, description="level of the one-sided binomial test of the promise"),
    ] = 0.01
    max_moves: Annotated[int, Field(ge=1, le=1000, description="VMs moved per relief at most")] = 8

    def __post_init__(self) -> None:
        if not 2 <= self.recent_windows <= 100_000:
            raise ValueError(f"recent_windows must be in [2, 100000], got {self.recent_windows}")
        if not (math.isfinite(self.alpha) and 0.0 < self.alpha < 0.5):
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if not 1 <= self.max_moves <= 1000:
            raise ValueError(f"max_moves must be in [1, 1000], got {self.max_moves}")


def promise_rejected(overflows: int, windows: int, rho: float, alpha: float) -> bool:
    """Whether ``overflows`` in ``windows`` reject P(overflow) <= rho at level alpha."""
    if windows < 0 or not 0 <= overflows <= windows:
        raise ValueError(f"need 0 <= overflows <= windows, got {overflows} of {windows}")
    return overflows >= overflows_needed(windows, rho, alpha)


@lru_cache(maxsize=4096)
def overflows_needed(windows: int, rho: float, alpha: float) -> int:
    """The fewest overflows in ``windows`` that reject the promise (windows + 1: none can)."""
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if windows < 0:
        raise ValueError(f"windows must be >= 0, got {windows}")
    # P(K >= k) = sf(k - 1); it falls with k, so the first k at or below alpha.
    tail = binom.sf(np.arange(windows + 1), windows, rho)  # tail[k - 1] = P(K >= k)
    below = np.flatnonzero(tail <= alpha)
    needed = int(below[0]) + 1 if len(below) else windows + 1
    return max(MIN_OVERFLOWS, needed)


class OverflowEvidence:
    """Per host column, the outcomes of its last ``recent_windows`` scored windows.

    A ring of booleans per host: O(1) per recorded outcome, memory bounded
    by hosts x recent_windows whatever the stream's length.
    """

    def __init__(self, rho: float, config: ReliefConfig, initial_hosts: int = 16) -> None:
        quantile_factor(rho)  # validates rho
        self.rho = rho
        self.config = config
        size = max(1, initial_hosts)
        self._ring: NDArray[np.bool_] = np.zeros((size, config.recent_windows), dtype=np.bool_)
        self._cursor: NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        self.windows: NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        self.overflows: NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        needed = [overflows_needed(n, rho, config.alpha) for n in range(config.recent_windows + 1)]
        self._needed: NDArray[np.int64] = np.asarray(needed, dtype=np.int64)

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
        due = self.overflows[hosts] >= self._needed[self.windows[hosts]]
        return hosts[due]

    def clear(self, host: int) -> None:
        """Forget a host's outcomes: its mix of VMs changed."""
        if host < len(self._cursor):
            self._ring[host] = False
            self._cursor[host] = 0
            self.windows[host] = 0
            self.overflows[host] = 0

    def due(self, host: int) -> bool:
        """Whether the host's kept outcomes reject the promise (the module's rule)."""
        if host >= len(self._cursor):
            return False
        return promise_rejected(
            int(self.overflows[host]), int(self.windows[host]), self.rho, self.config.alpha
        )


@dataclass(frozen=True, slots=True)
class TailFit:
    """GPA's fit test through the pool's current percentile method and margin."""

    rho: float
    method: str
    margin: float
    tolerance: float = 0.0

    def __post_init__(self) -> None:
        quantile_factor(self.rho)
        if self.method not in PERCENTILE_METHODS:
            raise ValueError(f"unknown tail method {self.method!r}")
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise ValueError(f"margin must be > 0, got {self.margin}")

    def _variance(self, terms: FloatArray) -> FloatArray:
        return effective_variance(
            self.method,
            quantile_factor(self.rho),
            self.rho,
            self.margin,
            terms[VARIANCE_ROW],
            terms[THIRD_ROW],
            terms[FOURTH_ROW],
        )

    def load(self, terms: FloatArray) -> FloatArray:
        """mu + margin x factor x sigma, per column of ``terms`` (rows: the cumulant sums)."""
        z = quantile_factor(self.rho)
        loaded: FloatArray = terms[MEAN_ROW] + z * np.sqrt(self._variance(terms))
        return loaded

    def fits(self, terms: FloatArray, capacity: FloatArray | float) -> BoolArray:
        return gpa_fits(
            terms[MEAN_ROW],
            self._variance(terms),
            capacity,
            quantile_factor(self.rho),
            self.tolerance,
        )

    def headroom(self, terms: FloatArray, capacity: FloatArray | float) -> FloatArray:
        return standardized_headroom(terms[MEAN_ROW], self._variance(terms), capacity)


@dataclass(frozen=True, slots=True)
class ReliefMove:
    """``vm``: index into the source's VMs; ``target``: a host index, or None for a new host."""

    vm: int
    target: int | None


def plan_relief(
    vm_terms: FloatArray,
    source_capacity: float,
    host_terms: FloatArray,
    host_capacity: FloatArray,
    fit: TailFit,
    max_moves: int,
    *,
    source: int | None = None,
    open_hosts: BoolArray | None = None,
) -> list[ReliefMove]:
    """Which of the source's VMs move, and where (see the module's docstring).

    ``vm_terms``: (4, k) current cumulant terms of the source's k VMs, in a
    fixed order (ties go to the lower index). ``host_terms`` (4, h) and
    ``host_capacity`` (h,): every host's current sums; ``source`` is not a
    target, nor is a host with ``open_hosts`` False. A move to a new host
    (``target`` None) opens one host of the source's capacity, which later
    VMs of the same relief may join (its index is then ``h``, ``h + 1``...).
    """
    if vm_terms.ndim != 2 or vm_terms.shape[0] != TERMS:
        raise ValueError(f"vm_terms must be (4, VMs), got {vm_terms.shape}")
    if host_terms.shape[0] != TERMS or host_terms.shape[1] != len(host_capacity):
        raise ValueError("host_terms must be (4, hosts) with one capacity per host")
    if max_moves < 1:
        raise ValueError(f"max_moves must be >= 1, got {max_moves}")
    staying = list(range(vm_terms.shape[1]))
    hosts = np.array(host_terms, dtype=np.float64, copy=True)
    capacity = np.asarray(host_capacity, dtype=np.float64).copy()
    allowed = (
        np.ones(len(capacity), dtype=np.bool_)
        if open_hosts is None
        else np.asarray(open_hosts, dtype=np.bool_).copy()
    )
    if source is not None and source < len(allowed):
        allowed[source] = False
    moves: list[ReliefMove] = []
    while len(staying) > 1 and len(moves) < max_moves:
        left = vm_terms[:, staying].sum(axis=1, keepdims=True)
        if moves and bool(fit.fits(left, source_capacity)[0]):
            break
        # The load left behind by each candidate's departure; the lowest goes.
        without = left - vm_terms[:, staying]
        leaving = staying[int(np.argmin(fit.load(without)))]
        staying.remove(leaving)
        terms = vm_terms[:, leaving : leaving + 1]
        after = hosts + terms
        fits = fit.fits(after, capacity) & allowed
        target: int | None = None
        if fits.any():
            rank = np.where(fits, fit.headroom(after, capacity), np.inf)
            target = int(np.argmin(rank))
            hosts[:, target] += terms[:, 0]
        else:
            # A new empty host of the source's kind; later movers may share it.
            hosts = np.hstack([hosts, terms])
            capacity = np.append(capacity, source_capacity)
            allowed = np.append(allowed, True)
        moves.append(ReliefMove(leaving, target))
    return moves


def new_host_indices(moves: Sequence[ReliefMove], hosts: int) -> list[int]:
    """The host each move lands on, new hosts numbered ``hosts``, ``hosts + 1``... in order."""
    landed: list[int] = []
    for move in moves:
        if move.target is None:
            landed.append(hosts)
            hosts += 1
        else:
            landed.append(move.target)
    return landed
