"""Admission policies (paper 002, section 4 and 6.1): zeroth, first and second moment.

- zeroth: admit if active cores after admission stay below ``threshold x capacity``;
- first (Markov): admit if, at every look-ahead time, the expected cluster cores
  with the candidate stay below ``threshold x capacity``;
- second (Cantelli): admit if, at every look-ahead time, the Cantelli bound
  ``Var / (Var + (capacity - E)^2)`` on running over capacity stays below
  ``threshold`` (1 when the mean already reaches capacity).

The marginal heuristic (section 6.1) lets a moment policy ignore a look-ahead
time at which the candidate is marginal. The paper's bound for "marginal" did
not survive in our copy of the text; we call the candidate marginal at a
look-ahead time when its expected cores there are below
``marginal_fraction x capacity`` (0 switches the heuristic off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from lavad.core.admission.cluster import ClusterModel, LookaheadGrid


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """One admission decision, explained.

    ``binding_horizon_s`` is the sub-policy horizon whose look-ahead time was
    tightest (rejected: the one that failed), ``binding_lookahead_s`` that time;
    ``failure_probability`` the policy's estimate there of running over
    capacity (Markov or Cantelli bound; None for the zeroth moment policy).
    """

    deployment_id: str
    time: float
    admitted: bool
    policy: str
    threshold: float
    cores: float
    binding_horizon_s: float | None
    binding_lookahead_s: float | None
    failure_probability: float | None
    reason: str


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides whether a deployment arriving with ``cores`` cores may join the cluster.

    ``grid`` is the look-ahead grid the policy reads moments on (None: it needs none).
    """

    @property
    def name(self) -> str: ...

    @property
    def threshold(self) -> float: ...

    @property
    def grid(self) -> LookaheadGrid | None: ...

    def decide(
        self, cluster: ClusterModel, deployment_id: str, cores: float, now: float
    ) -> AdmissionDecision: ...


@dataclass(slots=True)
class ZerothMoment:
    """Threshold on active cores (the industry baseline)."""

    threshold: float
    name: str = "zeroth"
    grid: LookaheadGrid | None = None

    def decide(
        self, cluster: ClusterModel, deployment_id: str, cores: float, now: float
    ) -> AdmissionDecision:
        after = cluster.active_cores + cores
        limit = self.threshold * cluster.capacity
        admitted = after < limit
        reason = f"active cores after admission {after:g} {'<' if admitted else '>='} {limit:g}"
        return _decision(self, deployment_id, now, cores, admitted, None, None, reason)


def _decision(
    policy: AdmissionPolicy,
    deployment_id: str,
    now: float,
    cores: float,
    admitted: bool,
    at: tuple[float, float] | None,
    failure: float | None,
    reason: str,
) -> AdmissionDecision:
    """``policy``'s decision; ``at``: the binding horizon and look-ahead time, if any."""
    horizon, lookahead = (None, None) if at is None else at
    return AdmissionDecision(
        deployment_id,
        now,
        admitted,
        policy.name,
        policy.threshold,
        cores,
        horizon,
        lookahead,
        failure,
        reason,
    )


def _marginal(cand_mean: np.ndarray, capacity: float, fraction: float) -> np.ndarray:
    return cand_mean < fraction * capacity


@dataclass(slots=True)
class _MomentPolicy:
    """What the first and second moment policies share: a score per look-ahead
    time from the moments with the candidate, the candidate's marginal times
    masked, and the verdict read at the worst time.

    ``name`` is declared here (and only given its default in each policy) so
    that the slots, which snapshots write field by field, stay in one class in
    the order threshold, grid, marginal_fraction, name.
    """

    threshold: float
    grid: LookaheadGrid
    marginal_fraction: float = 0.0
    name: str = ""

    def decide(
        self, cluster: ClusterModel, deployment_id: str, cores: float, now: float
    ) -> AdmissionDecision:
        total_mean, total_var = cluster.totals(now)
        cand_mean, cand_var = cluster.candidate(cores)
        mean = total_mean + cand_mean
        score = self._score(mean, total_var + cand_var, cluster.capacity)
        score = np.where(_marginal(cand_mean, cluster.capacity, self.marginal_fraction), 0.0, score)
        worst = int(np.argmax(score))
        admitted, failure, reason = self._verdict(score[worst], mean[worst], cluster.capacity)
        at = (float(cluster.horizon_of[worst]), float(cluster.taus[worst]))
        return _decision(self, deployment_id, now, cores, admitted, at, failure, reason)

    def _score(self, mean: np.ndarray, var: np.ndarray, capacity: float) -> np.ndarray:
        raise NotImplementedError

    def _verdict(self, score: float, mean: float, capacity: float) -> tuple[bool, float, str]:
        """Admitted, the estimated probability of running over capacity, and why."""
        raise NotImplementedError


@dataclass(slots=True)
class FirstMoment(_MomentPolicy):
    """Markov: expected cores below ``threshold x capacity`` at every look-ahead time."""

    name: str = "first"

    def _score(self, mean: np.ndarray, var: np.ndarray, capacity: float) -> np.ndarray:
        return mean / (self.threshold * capacity)

    def _verdict(self, score: float, mean: float, capacity: float) -> tuple[bool, float, str]:
        markov = float(min(1.0, mean / capacity))
        reason = f"max expected cores / (threshold x capacity) = {score:.4g}"
        return bool(score < 1.0), markov, reason


@dataclass(slots=True)
class SecondMoment(_MomentPolicy):
    """Cantelli: bound on P(cores >= capacity) below ``threshold`` at every look-ahead time."""

    name: str = "second"

    def _score(self, mean: np.ndarray, var: np.ndarray, capacity: float) -> np.ndarray:
        return cantelli(mean, var, capacity)

    def _verdict(self, score: float, mean: float, capacity: float) -> tuple[bool, float, str]:
        reason = f"max Cantelli bound {score:.4g} vs threshold {self.threshold:g}"
        return bool(score < self.threshold), float(score), reason


def cantelli(mean: np.ndarray, var: np.ndarray, capacity: float) -> np.ndarray:
    """Cantelli's bound on P(X >= capacity); 1 where the mean is not below capacity."""
    gap = capacity - mean
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.where(gap > 0, var / (var + gap * gap), 1.0)
    return np.asarray(np.nan_to_num(bound, nan=0.0), dtype=np.float64)
