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
sees one preference; a preference that can (``StackedScorer``, LAVA's)
writes its costs onto the levels in its own pass.
"""

from __future__ import annotations

import numpy as np

from lavad.core.cluster import ClusterState, FloatArray
from lavad.core.placement.framework import (
    NumpyScorer,
    PlacementRequest,
    ScorePlugin,
    StackedScorer,
)

# The preference below is LAVA's: whole numbers from 0 to 6 (lava.preference_cost),
# so level * 16 + preference is exact and ranks by level first. The waste
# guard packs this key in turn under its own stride (1024), which it exceeds
# by far.
_LEVEL_STRIDE = 16.0
_NO_HOSTS: frozenset[int] = frozenset()
# ``ClusterState.deployment_changes`` of a deployment with no hosts (or none named).
_UNCHANGED = (0, 0, -1)


class DeploymentAffinity(NumpyScorer):
    """0 on hosts running a VM of the request's deployment, 1 elsewhere, above ``below``.

    ``below``'s costs must be whole numbers from 0 to 15 for the packed key to
    rank by the level first; LAVA's preference, the one the registry gives it,
    is 0 to 6.

    The levels (times the stride) live in an array kept between calls, which
    changes only where the deployment's hosts differ from the last request's:
    a deployment's VMs arrive together, so most calls write no host, and the
    others a host or two. Writing every host of the pool, then those of the
    deployment, at each call cost LAS about 0.14x of Best Fit's replay time
    of the Azure dev split; the kept levels, 0.10x. Which hosts changed comes
    from the pool's stamps (``ClusterState.deployment_changes``): comparing
    the deployment's hosts with the marked ones at each call cost O(its
    hosts), and Azure V1's batches span up to 200 hosts. Invariant: an entry
    is 0 exactly where its host is in ``_marked``, which are the deployment's
    hosts as of ``_stamp``.
    """

    name = "affinity"

    def __init__(self, below: ScorePlugin | None = None) -> None:
        self.below = below
        self._stride = 1.0 if below is None else _LEVEL_STRIDE
        # ``_stride`` but on ``_marked``, the hosts running a VM of
        # ``_deployment`` when last asked, which are at 0.
        self._levels: FloatArray = np.zeros(0)
        self._deployment = ""
        self._marked: set[int] = set()
        # The stamp of ``_deployment``'s last change when it was marked (0: none
        # seen; -1: to rebuild), in the pool it was marked for: stamps are one
        # pool's count, so another pool's (a scorer reused) rebuilds.
        self._stamp = -1
        self._pool: ClusterState | None = None

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        n = cluster.n_hosts
        levels = self.levels(cluster, request)[:n]
        below = self.below
        if below is None:
            np.copyto(out[:n], levels)
        elif isinstance(below, StackedScorer):
            below.score_onto(cluster, request, levels, out)
        else:
            key = out[:n]
            below.score(cluster, request, key, scratch)
            key += levels

    def levels(self, cluster: ClusterState, request: PlacementRequest) -> FloatArray:
        """The level of each host times the stride, in an array of the scorer's own.

        Its first ``n_hosts`` entries are the levels (with no ``below``, the
        whole key); the caller only reads them, and only until the next call.
        """
        n = cluster.n_hosts
        levels = self._levels
        marked = self._marked
        if len(levels) < n:
            levels = self._levels = np.full(max(n, 2 * len(levels), 64), self._stride)
            marked.clear()
            self._stamp = -1
        if cluster is not self._pool:
            self._pool = cluster
            self._stamp = -1
        deployment = request.deployment
        change = cluster.deployment_changes.get(deployment) if deployment else None
        stamp, before, changed = _UNCHANGED if change is None else change
        if deployment == self._deployment:
            if stamp == self._stamp:
                return levels
            if before == self._stamp:
                # One host joined or left the deployment since it was marked.
                self._stamp = stamp
                if changed in cluster.deployment_hosts[deployment]:
                    levels[changed] = 0.0
                    marked.add(changed)
                else:
                    levels[changed] = self._stride
                    marked.discard(changed)
                return levels
        self._deployment = deployment
        self._stamp = stamp
        holding = cluster.deployment_hosts.get(deployment) if change is not None else None
        hosts = holding.keys() if holding else _NO_HOSTS
        for host in marked - hosts:
            levels[host] = self._stride
        marked.intersection_update(hosts)
        for host in hosts:
            if host not in marked:
                levels[host] = 0.0
                marked.add(host)
        return levels
