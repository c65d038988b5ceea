"""Cluster state for admission: the deployments' online models and their cached moments.

The moment policies need, at every look-ahead time, the sum over the cluster's
deployments of each one's mean and variance of future cores. Recomputing that
for 500 deployments x 3000 look-ahead times at each arrival costs tens of
milliseconds, so each deployment's row is cached and recomputed only when its
own state changes (an event of that deployment marks it dirty; dirty rows are
recomputed together, vectorised, at the next decision). The sums are kept
incrementally.

Choice to note: a cached row describes the deployment as of its last event,
with look-ahead counted from then. Between its events a deployment's belief
only changes by accrued exposure, so staleness is bounded by ``refresh``, which
recomputes every row at ``now`` (the daemon calls it from its timers; the
replay every ``refresh_s`` of event time).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from lavad.models.argument_checks import require_at_least
from lavad.models.deployments import DeploymentPriors, DeploymentState, core_count_moments
from lavad.models.deployments.moments import FloatArray

YEAR_S = 365.0 * 86400.0
DAY_S = 86400.0
# The paper's sub-policies: 3 years, 1 year, 1 month, 1 week, 24 hours.
PAPER_HORIZONS_S: tuple[float, ...] = (
    3 * YEAR_S,
    YEAR_S,
    30 * DAY_S,
    7 * DAY_S,
    DAY_S,
)
PAPER_STEPS = 600


@dataclass(frozen=True, slots=True)
class LookaheadGrid:
    """Look-ahead times of all sub-policies, concatenated; ``horizon_of[i]`` labels each."""

    horizons_s: tuple[float, ...]
    steps: int

    def __post_init__(self) -> None:
        if not self.horizons_s:
            raise ValueError("horizons_s must not be empty")
        if any(h <= 0 for h in self.horizons_s):
            raise ValueError(f"horizons_s must be positive, got {self.horizons_s}")
        require_at_least(1, steps=self.steps)

    @property
    def taus(self) -> FloatArray:
        k = np.arange(1, self.steps + 1, dtype=np.float64) / self.steps
        return np.concatenate([h * k for h in self.horizons_s])

    @property
    def horizon_of(self) -> FloatArray:
        return np.repeat(np.asarray(self.horizons_s, dtype=np.float64), self.steps)


def _beliefs(
    states: Sequence[DeploymentState], priors: DeploymentPriors
) -> tuple[FloatArray, tuple[tuple[FloatArray, FloatArray], ...]]:
    """Posterior (shape, rate) arrays for the four rates, vectorised over ``states``."""
    cores = np.array([s.cores for s in states], dtype=np.float64)
    deaths = np.array([s.core_deaths for s in states], dtype=np.float64)
    exposure = np.array([s.core_exposure for s in states], dtype=np.float64)
    outs = np.array([s.scale_outs for s in states], dtype=np.float64)
    alive = np.array([s.alive_time for s in states], dtype=np.float64)
    excess = np.array([s.excess_size for s in states], dtype=np.float64)
    p = priors
    return cores, (
        (p.core_death.shape + deaths, p.core_death.rate + exposure),
        (p.scale_out.shape + outs, p.scale_out.rate + alive),
        (p.size.shape + excess, p.size.rate + outs),
        (np.full_like(cores, p.kill.shape), p.kill.rate + alive),
    )


def state_moments(
    states: Sequence[DeploymentState], priors: DeploymentPriors, taus: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Mean and variance rows, shape ``(len(states), len(taus))``."""
    cores, (death, scale, size, kill) = _beliefs(states, priors)
    return core_count_moments(cores, death, scale, size, kill, taus)


class ClusterModel:
    """The deployments admitted to one cluster, their online states and cached moment rows."""

    def __init__(
        self,
        priors: DeploymentPriors,
        grid: LookaheadGrid,
        capacity: float,
        *,
        max_dirty: int = 16,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        require_at_least(1, max_dirty=max_dirty)
        # Dirty rows are recomputed in batches of this many as events come, so a
        # decision never pays for more than max_dirty - 1 of them.
        self.max_dirty = max_dirty
        self.priors = priors
        self.grid = grid
        self.capacity = capacity
        self.taus = grid.taus
        self.horizon_of = grid.horizon_of
        self.states: dict[str, DeploymentState] = {}
        self.active_cores = 0.0
        self._rows: dict[str, tuple[FloatArray, FloatArray]] = {}
        self._dirty: set[str] = set()
        self._mean = np.zeros_like(self.taus)
        self._var = np.zeros_like(self.taus)
        # Arriving deployments differ only in their initial size: rows cached by size.
        self._candidates: dict[float, tuple[FloatArray, FloatArray]] = {}

    def __len__(self) -> int:
        return len(self.states)

    def add(self, deployment_id: str, now: float, cores: float) -> None:
        if deployment_id in self.states:
            raise ValueError(f"deployment_id {deployment_id!r} is already in the cluster")
        self.states[deployment_id] = DeploymentState.arrive(deployment_id, now, cores)
        self.active_cores += cores
        self._mark(deployment_id, now)

    def scale_out(self, deployment_id: str, now: float, cores: float) -> None:
        self._state(deployment_id).scale_out(now, cores)
        self.active_cores += cores
        self._mark(deployment_id, now)

    def scale_in(self, deployment_id: str, now: float, cores: float) -> bool:
        """Cores die; returns True when the deployment reached zero cores and left."""
        state = self._state(deployment_id)
        before = state.cores
        state.scale_in(now, cores)
        self.active_cores -= before - state.cores
        if state.cores <= 0:
            self.remove(deployment_id)
            return True
        self._mark(deployment_id, now)
        return False

    def _mark(self, deployment_id: str, now: float) -> None:
        self._dirty.add(deployment_id)
        if len(self._dirty) >= self.max_dirty:
            self.totals(now)

    def remove(self, deployment_id: str) -> None:
        state = self.states.pop(deployment_id)
        self.active_cores -= state.cores
        self._dirty.discard(deployment_id)
        row = self._rows.pop(deployment_id, None)
        if row is not None:
            self._mean -= row[0]
            self._var -= row[1]

    def _state(self, deployment_id: str) -> DeploymentState:
        state = self.states.get(deployment_id)
        if state is None:
            raise ValueError(f"deployment_id {deployment_id!r} is not in the cluster")
        return state

    def _recompute(self, ids: Iterable[str], now: float) -> None:
        chosen = [d for d in ids if d in self.states]
        if not chosen:
            return
        states = [self.states[d] for d in chosen]
        for state in states:
            state.advance(max(now, state.last_time))
        mean, var = state_moments(states, self.priors, self.taus)
        for k, deployment_id in enumerate(chosen):
            old = self._rows.get(deployment_id)
            if old is not None:
                self._mean -= old[0]
                self._var -= old[1]
            self._rows[deployment_id] = (mean[k], var[k])
        self._mean += mean.sum(axis=0)
        self._var += var.sum(axis=0)

    def refresh(self, now: float) -> None:
        """Recompute every row at ``now`` and the sums from scratch (drops rounding drift)."""
        self._dirty.clear()
        self._rows.clear()
        self._mean = np.zeros_like(self.taus)
        self._var = np.zeros_like(self.taus)
        self._recompute(list(self.states), now)

    def totals(self, now: float) -> tuple[FloatArray, FloatArray]:
        """Sum of means and of variances over the cluster (deployments are independent)."""
        if self._dirty:
            dirty = sorted(self._dirty)
            self._dirty.clear()
            self._recompute(dirty, now)
        return self._mean, self._var

    def candidate(self, cores: float) -> tuple[FloatArray, FloatArray]:
        """Moment rows of an arriving deployment: its initial size and the population prior."""
        cached = self._candidates.get(cores)
        if cached is None:
            state = DeploymentState.arrive("candidate", 0.0, cores)
            mean, var = state_moments([state], self.priors, self.taus)
            cached = (mean[0], var[0])
            if len(self._candidates) < 1024:
                self._candidates[cores] = cached
        return cached
