"""The placement pipeline: filter plugins -> lexicographic score plugins -> seeded tie-break.

Plugins are small Protocols, in the spirit of the Kubernetes scheduler
framework. Filters clear bits of a boolean host mask in place; scorers return
one float per host (lower is better) and are applied lexicographically: the
first scorer decides, the next only separates the first one's ties. Working on
full-length contiguous arrays (then masking) is cheaper in numpy than gathering
candidate subsets, so the mask is carried to the end and only the final tie
set is turned into indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from lavad.daemon.cluster import (
    FIT_TOLERANCE,
    N_RESOURCES,
    RESOURCES,
    BoolArray,
    ClusterState,
    FloatArray,
    VmRecord,
)


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What the pipeline needs to know about a VM asking for a host."""

    vm_id: str
    demand: tuple[float, float, float, float]
    deployment: str
    max_per_host: int | None
    now: float

    @property
    def requested_resources(self) -> tuple[int, ...]:
        return tuple(r for r in range(N_RESOURCES) if self.demand[r])


@dataclass(frozen=True, slots=True)
class Placed:
    host: int
    candidates: int
    scores: dict[str, float]


@dataclass(frozen=True, slots=True)
class Unfit:
    """No host takes the request now.

    ``retryable`` separates "unfit, may retry" (hosts exist that could hold it
    once capacity frees up) from "unfit, final" (no host is large enough).
    """

    reason: str
    retryable: bool
    rejected_by: dict[str, int] = field(default_factory=dict)


PlacementResult = Placed | Unfit


class FilterPlugin(Protocol):
    name: str

    def apply(self, cluster: ClusterState, request: PlacementRequest, mask: BoolArray) -> None:
        """Clear the mask bit of every host that cannot take ``request``."""


class ScorePlugin(Protocol):
    name: str

    def score(self, cluster: ClusterState, request: PlacementRequest) -> FloatArray:
        """One score per host column (length ``cluster.n_hosts``); lower is better.

        Only the hosts still in the mask are looked at, so a scorer may leave
        any value (even nan) for the others.
        """


class PlacementHooks(Protocol):
    """State a policy keeps beside the cluster (lifetime classes, deadlines, ...)."""

    def on_booked(self, cluster: ClusterState, record: VmRecord, now: float) -> None: ...

    def on_released(self, cluster: ClusterState, record: VmRecord, now: float) -> None: ...


# ------------------------------------------------------------------ filters


class SchedulableFilter:
    """Only hosts that are up and not draining receive VMs."""

    name = "schedulable"

    def apply(self, cluster: ClusterState, request: PlacementRequest, mask: BoolArray) -> None:
        np.logical_and(mask, cluster.schedulable[: cluster.n_hosts], out=mask)


class FitFilter:
    """Hard fit: every requested resource fits in the host's free capacity."""

    name = "fit"

    def apply(self, cluster: ClusterState, request: PlacementRequest, mask: BoolArray) -> None:
        n = cluster.n_hosts
        free = cluster.free
        demand = request.demand
        for r in range(N_RESOURCES):
            amount = demand[r]
            if amount:
                np.logical_and(mask, free[r, :n] >= amount - FIT_TOLERANCE, out=mask)


class AntiAffinityFilter:
    """At most ``max_per_host`` VMs of one deployment on a host."""

    name = "anti_affinity"

    def apply(self, cluster: ClusterState, request: PlacementRequest, mask: BoolArray) -> None:
        limit = request.max_per_host
        if limit is None or not request.deployment:
            return
        per_host = cluster.deployment_hosts.get(request.deployment)
        if not per_host:
            return
        for host, count in per_host.items():
            if count >= limit:
                mask[host] = False


DEFAULT_FILTERS: tuple[FilterPlugin, ...] = (SchedulableFilter(), FitFilter(), AntiAffinityFilter())


# ------------------------------------------------------------------- policy


class Policy:
    """A named pipeline of filters and lexicographic scorers with a seeded tie-break."""

    def __init__(
        self,
        name: str,
        scorers: tuple[ScorePlugin, ...],
        rng: np.random.Generator,
        *,
        filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS,
        random_ties: bool = True,
        hooks: PlacementHooks | None = None,
    ) -> None:
        self.name = name
        self.filters = filters
        self.scorers = scorers
        self.rng = rng
        self.random_ties = random_ties
        self.hooks = hooks

    def place(self, cluster: ClusterState, request: PlacementRequest) -> PlacementResult:
        n = cluster.n_hosts
        mask = np.ones(n, dtype=np.bool_)
        for plugin in self.filters:
            plugin.apply(cluster, request, mask)
        if not mask.any():
            return self._explain_unfit(cluster, request)
        candidates = int(np.count_nonzero(mask))
        scores: dict[str, float] = {}
        for scorer in self.scorers:
            values = scorer.score(cluster, request)
            best = float(np.min(values, where=mask, initial=np.inf))
            scores[scorer.name] = best
            np.logical_and(mask, values == best, out=mask)
        ties = np.flatnonzero(mask)
        if len(ties) == 1 or not self.random_ties:
            host = int(ties[0])
        else:
            host = int(ties[self.rng.integers(len(ties))])
        return Placed(host=host, candidates=candidates, scores=scores)

    def _explain_unfit(self, cluster: ClusterState, request: PlacementRequest) -> Unfit:
        """Kubernetes-style "0/N hosts: a rejected by fit, b by ..." (failure path only)."""
        n = cluster.n_hosts
        if n == 0:
            return Unfit("the pool has no hosts", retryable=True)
        mask = np.ones(n, dtype=np.bool_)
        rejected: dict[str, int] = {}
        for plugin in self.filters:
            before = int(np.count_nonzero(mask))
            plugin.apply(cluster, request, mask)
            rejected[plugin.name] = before - int(np.count_nonzero(mask))
        could_ever = cluster.fits_capacity(request.demand)
        if not could_ever.any():
            asked = ", ".join(
                f"{RESOURCES[r]}={request.demand[r]:g}" for r in request.requested_resources
            )
            return Unfit(
                f"larger than any host in the pool ({asked})", retryable=False, rejected_by=rejected
            )
        detail = ", ".join(f"{count} by {name}" for name, count in rejected.items() if count)
        return Unfit(f"0/{n} hosts fit: {detail}", retryable=True, rejected_by=rejected)
