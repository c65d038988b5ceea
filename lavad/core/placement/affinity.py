"""Deployment affinity: the hosts already running a VM of the request's deployment first.

Why a lifetime policy wants it: VMs of one deployment tend to end together,
and no model of a VM's own features can tell when. In Azure V1, two VMs of
one tenant batch fall in the same lifetime bin 57% of the time, two of the
same flavor at random 8%; every sibling arrives before any of them exits,
so at placement the batch's end is unknown, but a host holding one batch
empties when that batch ends (docs/results/placement-matrix.md, "Deployment
affinity"). LAS alone ranks a host holding a sibling as it would any host
whose VMs' learned lifetimes look alike, and often spreads a batch over
hosts whose other VMs outlive it.

The level is 0 on a host holding a VM of the deployment and 1 elsewhere
(every host at 1 for a request without a deployment, or its first VM). It
sits where LAVA's preference sits: under the waste guard, which keeps it
from stranding capacity, and above LAS. Above a preference of its own
(``below``, LAVA's, small integers) it packs ``level * stride + preference``
into one key, as the waste guard does, so the compiled lifetime scan still
sees one preference.
"""

from __future__ import annotations

import numpy as np

from lavad.core.cluster import ClusterState, FloatArray
from lavad.core.placement.framework import NumpyScorer, PlacementRequest, ScorePlugin

# The preference below is LAVA's: whole numbers from 0 to 6 (lava.preference_cost),
# so level * 16 + preference is exact and ranks by level first. The waste
# guard packs this key in turn under its own stride (1024), which it exceeds
# by far.
_LEVEL_STRIDE = 16.0
# Most deployments run on a few hosts: a write per host costs less than
# building an index array (about 0.15 us a host against 2 us), up to about
# this many hosts.
_FEW_HOSTS = 16


class DeploymentAffinity(NumpyScorer):
    """0 on hosts running a VM of the request's deployment, 1 elsewhere, above ``below``.

    ``below``'s costs must be whole numbers from 0 to 15 for the packed key to
    rank by the level first; LAVA's preference, the one the registry gives it,
    is 0 to 6.
    """

    name = "affinity"

    def __init__(self, below: ScorePlugin | None = None) -> None:
        self.below = below

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        n = cluster.n_hosts
        key = out[:n]
        below = self.below
        stride = 1.0
        if below is None:
            key.fill(1.0)
        else:
            below.score(cluster, request, key, scratch)
            stride = _LEVEL_STRIDE
            key += stride
        deployment = request.deployment
        if not deployment:
            return
        holding = cluster.deployment_hosts.get(deployment)
        if not holding:
            return
        if len(holding) > _FEW_HOSTS:
            hosts = np.fromiter(holding, dtype=np.int64, count=len(holding))
            key[hosts] -= stride
        else:
            for host in holding:
                key[host] -= stride
