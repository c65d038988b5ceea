"""First Fit: the lowest-numbered host that passes the filters.

Hosts are numbered in the order they joined the pool, so First Fit packs the
oldest hosts first and leaves the newest empty; there are never ties.
"""

from __future__ import annotations

import numpy as np

from lavad.core.cluster import N_RESOURCES, ClusterState, FloatArray
from lavad.core.placement import kernels
from lavad.core.placement.framework import PlacementRequest


class FirstFitScore:
    name = "firstfit"
    kernel = kernels.FIRSTFIT
    tie_tolerance = 0.0

    def __init__(self) -> None:
        self._index: FloatArray = np.zeros(0)
        self.kernel_weights: FloatArray = np.zeros(N_RESOURCES)

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        n = cluster.n_hosts
        if len(self._index) < n:
            self._index = np.arange(max(n, 2 * len(self._index)), dtype=np.float64)
        np.copyto(out, self._index[:n])
