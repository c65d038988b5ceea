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

from lavad.core.cluster import N_RESOURCES, RESOURCES, ClusterState, FloatArray
from lavad.core.placement import kernels
from lavad.core.placement.framework import PlacementRequest


class BestFitScore:
    name = "bestfit"
    kernel = kernels.BESTFIT
    tie_tolerance = 0.0

    def __init__(self, weights: dict[str, float] | None = None) -> None:
        given = weights or {}
        self.weights = tuple(float(given.get(name, 1.0)) for name in RESOURCES)
        self.kernel_weights: FloatArray = np.array(self.weights)

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        n = cluster.n_hosts
        out.fill(0.0)
        for r in range(N_RESOURCES):
            weight = self.weights[r]
            if not weight or not cluster.resource_present[r]:
                continue
            np.subtract(cluster.free[r, :n], request.demand[r], out=scratch)
            np.multiply(scratch, cluster.inv_capacity[r, :n], out=scratch)
            if weight != 1.0:
                np.multiply(scratch, weight, out=scratch)
            np.add(out, scratch, out=out)
