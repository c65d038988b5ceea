"""LAS that counts the capacity a placement strands as host time, beside the host time it extends.

LAS's temporal cost (LAVA paper, section 4.2) is the bucket of
dT = max(vm_exit - host_exit, 0): the host time a placement adds by keeping
its host busy after the host would have emptied. It knows nothing of the
shape a placement leaves, so a host that outlives the VM wins even when the
VM leaves it a fragment no request of the pool's mix can use; on Azure
shapes where hosts can strand, learned LAS strands a multiple of Best Fit's
CPU that way and gives back its gain in empty hosts
(docs/results/placement-matrix.md). In Borg, LAS sits
above a waste-minimising packing score; our Best Fit has no notion of waste.

This score adds the other host time a placement costs, under the same
buckets. While the VM shares its host, it leaves the host a fraction ``a``
of its capacity stranded (``waste.py``: the added waste of the pool's
request mix, as a fraction of the host averaged over the resources Best Fit
weighs); once the host would have emptied, it keeps the whole host. For a
VM of remaining life q on a host of remaining life r:

    host time = max(q - r, 0)  +  w * a * min(q, r)

and the cost is the LAS bucket of that host time, in expectation over the
same quantiles LAS takes (the VM's and, with ``host_quantiles``, the
host's), as counts of (quantile, bucket bound) pairs exactly as LAS counts
them. A host the placement strands nothing on (a <= 0, repairs included)
costs exactly its LAS cost; a host it strands on costs the larger of its LAS
cost and the count above.

At w = 1 a fraction of a host held for an hour is that fraction of a
host-hour. That undercounts: a fragment also blocks the requests that would
have used the rest of the host, and the mix's fill is an estimate. The
default w = 8 was chosen on the placement matrix by its worst cell
(``lavad evaluate placement``; docs/results/placement-matrix.md):
below it learned LAS strands more on hosts that can strand, above it the
gain in empty hosts falls.

Departure from the paper: LAS stays a lexicographic level above Best Fit, but
the level's cost is no longer dT alone. The lifetime scan counts a host's
stranded time only once LAS's cost alone leaves the host in the running
(``lifetime_scan``, from ``kernel_input``), in the same
pass; a test holds its decisions equal to the pipeline's (``score``).
"""

from __future__ import annotations

import numba
import numpy as np

from lavad.core.cluster import FIT_TOLERANCE, N_RESOURCES, ClusterState, FloatArray
from lavad.core.placement.framework import PlacementRequest
from lavad.core.placement.lifetime import (
    LAS_BUCKETS_S,
    LasTemporalCost,
    LifetimeTracker,
)
from lavad.core.placement.strand_kernels import (
    Stranding,
    WastePool,
    present_weights,
    strands_count,
)
from lavad.core.placement.waste import RequestMix, waste_costs


@numba.njit(cache=True, nogil=True)
def stranding_costs(
    pool: WastePool,
    n_hosts: int,
    demand: FloatArray,
    strand: Stranding,
    las: FloatArray,
    now: float,
    scratch: FloatArray,
) -> None:
    """Raise ``las[h]`` (each fitting host's LAS count) to its count with stranded host time."""
    free, inv_capacity, unschedulable, present = pool
    used = present_weights(strand[0], present)
    total = used.sum()
    if total <= 0.0:
        return
    measure = (used, strand[1], strand[2], FIT_TOLERANCE)
    # A memory built here, not the module's NO_MEMORY: numba freezes a global's
    # arrays read-only, and the kernel's (unreached) writes must type.
    no_memory = (np.zeros((2 * free.shape[0], 0)), np.zeros(0))
    waste_costs(free, inv_capacity, unschedulable, n_hosts, demand, measure, scratch, no_memory)
    for h in range(n_hosts):
        # Unfit hosts (inf) are the filters' business.
        las[h] = max(las[h], strands_count(scratch[h], total, strand, h, now, np.inf))


def warm_up_stranding() -> None:
    """Compile (or load from numba's cache) before the first placement is timed."""
    free = np.ones((N_RESOURCES, 1))
    present = np.ones(N_RESOURCES, dtype=np.bool_)
    strand: Stranding = (
        np.ones(N_RESOURCES), np.ones((1 << N_RESOURCES, N_RESOURCES)), np.zeros((1, N_RESOURCES)),
        np.ones(1),
        np.ones((1, 1)), LAS_BUCKETS_S, 1.0,
    )  # fmt: skip
    pool = (free, free, np.zeros(1, dtype=np.bool_), present)
    stranding_costs(pool, 1, np.zeros(N_RESOURCES), strand, np.zeros(1), 0.0, np.zeros(1))


class LasStrandingCost(LasTemporalCost):
    """LAS's bucketed host time, counting the host time a placement strands as well.

    Keeps the pool's request mix (``RequestMix``, as the stranding metric
    keeps it) from every request it scores, each once. With no mix yet (the
    pool's first request) nothing is known to strand and it is LAS.
    """

    name = "las"

    def __init__(
        self,
        tracker: LifetimeTracker,
        mix: RequestMix,
        weights: FloatArray,
        weight: float = 1.0,
        tolerance: float = 0.0,
    ) -> None:
        if not weight > 0:
            raise ValueError(f"weight must be > 0, got {weight}")
        super().__init__(tracker, tolerance)
        self.weight = weight
        self.mix = mix
        self.weights = np.ascontiguousarray(weights, dtype=np.float64)
        self._demand = np.zeros(N_RESOURCES)
        self._scratch: FloatArray = np.zeros(0)
        self._last_seen: tuple[str, float] | None = None
        # The tracker's settings are fixed: whether LAS costs hosts by their quantiles.
        self._by_host_quantiles = tracker.uses_host_quantiles
        warm_up_stranding()

    def observe(self, request: PlacementRequest) -> None:
        """Count ``request`` in the mix once, whichever path (scan, pipeline) scores it."""
        seen = (request.vm_id, request.now)
        if seen != self._last_seen:
            self._last_seen = seen
            self.mix.add(request.demand)

    def kernel_input(self, request: PlacementRequest, exits: FloatArray) -> Stranding | None:
        """The ``Stranding`` the kernels count ``request``'s stranded host time with
        (``exits`` the hosts' exits as LAS costs them, the array the scan reads and
        refreshes); None before the pool has a mix."""
        mix = self.mix
        if not mix.known:
            return None
        return (
            self.weights,
            mix.directions,
            mix.minimal,
            self.tracker.vm_quantiles(request),
            exits,
            LAS_BUCKETS_S,
            self.weight,
        )

    def scan_exits(self, cluster: ClusterState) -> FloatArray:
        """Per host, its exit times as LAS costs them: (hosts, H) quantiles, or (hosts, 1)
        the point exit (a host without VMs: -inf; the kernels clip at now). Not copies:
        the scan reads each host's after bringing it up to date."""
        tracker = self.tracker
        n = cluster.n_hosts
        if self._by_host_quantiles:
            return tracker.hosts.current_quantiles(n)
        exits: FloatArray = tracker.hosts.latest(n).reshape(-1, 1)
        return exits

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        self.observe(request)
        super().score(cluster, request, out, scratch)
        # LAS's own score just brought every host's quantiles up to date.
        strand = self.kernel_input(request, self.scan_exits(cluster))
        if strand is None:
            return
        n = cluster.n_hosts
        if len(self._scratch) < n:
            self._scratch = np.zeros(max(n, 2 * len(self._scratch), 64))
        demand = self._demand
        demand[:] = request.demand
        pool = (cluster.free, cluster.inv_capacity, cluster.unschedulable, cluster.resource_present)
        stranding_costs(pool, n, demand, strand, out, request.now, self._scratch)
