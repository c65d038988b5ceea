"""Best Fit, multi-dimensional: the host left tightest after the placement wins.

Score of host h for demand d (lower is better):

    sum over resources r the host has:  w_r * (free_r(h) - d_r) / capacity_r(h)

the weighted sum of the fractions of each resource left free. Normalising by
the host's own capacity makes heterogeneous hosts (OpenB) comparable, and
counting every resource the host has, not only those requested, steers
CPU-only requests away from GPU hosts whose GPUs would be left idle.
"""

from __future__ import annotations

import numpy as np

from lavad.daemon.cluster import N_RESOURCES, RESOURCES, ClusterState, FloatArray
from lavad.daemon.placement.framework import PlacementRequest


class BestFitScore:
    name = "bestfit"

    def __init__(self, weights: dict[str, float] | None = None) -> None:
        given = weights or {}
        self.weights = tuple(float(given.get(name, 1.0)) for name in RESOURCES)

    def score(self, cluster: ClusterState, request: PlacementRequest) -> FloatArray:
        n = cluster.n_hosts
        total = np.zeros(n)
        for r in range(N_RESOURCES):
            weight = self.weights[r]
            if not weight or not cluster.resource_present[r]:
                continue
            left = cluster.free[r, :n] - request.demand[r]
            left *= cluster.inv_capacity[r, :n]
            if weight != 1.0:
                left *= weight
            total += left
        return total
