"""Waste-aware packing: what a placement leaves that the pool's request mix cannot use.

Borg's waste minimisation (LAVA paper, section 2.2) scores a host by the free
shapes a placement leaves against the workload the pool expects; the LAVA
paper measures the outcome by an inflation simulation (``metrics.stranding``):
fill every host with the pool's recent request mix until nothing fits, and
what is left is stranded. This module scores a host by a closed form of that
same simulation, so the score and the metric speak of one thing:

* The mix is the pool's last ``window`` request shapes, their ``max_shapes``
  most common ones, as the stranding metric keeps it (``RequestMix``).
* ``waste(f)`` of a free vector f: when no shape of the mix fits f, all of f
  is stranded. Otherwise the inflation fills f by draws from the mix, so (up
  to the last VM) it consumes resources in the mix's mean proportions m until
  one resource runs out: t = min_r f_r / m_r, leaving f - t m. From then on
  only the shapes that ask nothing of that resource still fit (a pod without
  a GPU on a host whose GPUs are taken), so the fill goes on in their mean
  direction, and so on until no shape asks only for what is left, which is
  stranded. Each resource counts as its fraction of the host's capacity
  (weighted as Best Fit weights it), so the units are Best Fit's.
* A placement's cost is how much it adds to the pool's stranded capacity:
  ``waste(free - d) - waste(free)``. A roomy host with a balanced remainder
  adds nothing, unlike under Best Fit, which prefers the tightest host
  whatever it leaves; a request that uses a host's surplus resource lowers
  that host's waste.

Where we depart from Borg (whose score is not public in detail) and from an
exact simulation: the fill follows mean directions instead of simulating
draws, which is exact while several VMs still fit and off by at most the
last VM's granularity; that keeps the score O(resources^2) per host, cheap
enough to run before every lifetime-aware placement. A single leg along the
whole mix's mean (what this score was first) calls everything left on a host
whose GPUs are taken stranded, although the mix's CPU-only pods would use
it: on the bundled OpenB slice's mix the legs come within 0.046 of the
simulation's waste on average over a grid of free vectors, one leg within
0.130 (``tests/test_waste.py``). Where every shape asks for every resource
(Azure's VMs: cores and memory) the two are the same to the bit.

The guard (``WasteGuard``) turns the cost into a lexicographic level: hosts
whose cost is within ``tolerance`` of the best feasible host's share level 0,
the next ``tolerance`` level 1, and so on. Below it LAS (or a preference, the
deployment affinity or LAVA's classes, then LAS) decides among level-0 hosts
and Best Fit breaks their ties, so a lifetime score can pick any host that
strands no more than the least stranding host plus the tolerance, and never
one that strands more when such a host fits. Alone above Best Fit it is the
``waste`` packing policy.

The best host is the best of those that already run VMs, when one of them
fits; an empty host sets the bar only when no used host fits. Measured from
every host, an empty host (which often *lowers* its own structural waste by
taking a VM) puts every used host that would keep a fragment above level 0,
and the guard spreads VMs over hosts that would have stayed empty: on a
fixed memory-tight fleet that rule loses 1.08 pp of empty hosts to Best Fit
while stranding less (docs/results/placement-matrix.md, "The waste guard's bar").
On a pool scored by its empty hosts, a fragment on a used host costs less
than a host opened to spare it.
"""

from __future__ import annotations

from collections import Counter

import numba
import numpy as np

from lavad.core.cluster import FIT_TOLERANCE, N_RESOURCES, ClusterState, FloatArray
from lavad.core.metrics.stranding import most_common
from lavad.core.placement.framework import NumpyScorer, PlacementRequest, ScorePlugin
from lavad.core.placement.strand_kernels import (
    WasteMeasure,
    WastePool,
    added_waste,
    leftover_waste,
    present_weights,
)

Shape = tuple[float, float, float, float]

# The waste guard's test of a lifetime scan's choice (``lifetime_scan``):
# how waste is measured, the guard's step, and whether to test at all (False:
# no guard, or its mix is not yet known; every host then counts as within).
GuardTest = tuple[WasteMeasure, float, bool]
NO_GUARD_TEST: GuardTest = (
    (
        np.zeros(N_RESOURCES),
        np.zeros((1 << N_RESOURCES, N_RESOURCES)),
        np.zeros((0, N_RESOURCES)),
        FIT_TOLERANCE,
    ),
    0.0,
    False,
)

# A lexicographic key packs the guard's level above the preference below it
# (LAVA's costs are small integers, at most 6 plus a class difference): the
# level times this stays exact in float64 for any level the tolerance bounds.
_LEVEL_STRIDE = 1024.0


class RequestMix:
    """The pool's recent request shapes, as the stranding inflation keeps them.

    A ring of the last ``window`` shapes with their counts kept as they enter
    and leave, so each request costs O(1). The mean direction and the
    shapes a fragment must fit are refreshed every ``refresh_every`` requests,
    not per placement (the mix moves slowly), and while the mix is young at
    its 1st, 2nd, 4th, 8th... request, so a young mix is known early at a
    logarithmic number of refreshes. A refresh sorts the distinct shapes in
    the window, at most ``window`` whatever the stream sends.
    """

    def __init__(self, window: int, max_shapes: int, refresh_every: int) -> None:
        if window < 1 or max_shapes < 1 or refresh_every < 1:
            raise ValueError("window, max_shapes and refresh_every must be >= 1")
        self.window = window
        self.max_shapes = max_shapes
        self.refresh_every = refresh_every
        self._ring: list[Shape] = []
        self._next = 0
        self._counts: Counter[Shape] = Counter()
        self._since_refresh = 0
        self._seen = 0
        # Row k: the mean demand of the mix's shapes that ask nothing of the
        # resources in bit set k, weighted by their counts (zeros: no such
        # shape, or no mix yet). Row 0 is the whole mix's mean.
        self.directions: FloatArray = np.zeros((1 << N_RESOURCES, N_RESOURCES))
        # Shapes no other shape of the mix is smaller than in every resource:
        # a free vector fits some shape of the mix iff it fits one of these.
        self.minimal: FloatArray = np.zeros((0, N_RESOURCES))

    @property
    def known(self) -> bool:
        return len(self.minimal) > 0

    def check_restored(self) -> None:
        """Raise ValueError if a restored mix could make the compiled score read past an array.

        ``leftover_waste`` indexes ``directions`` by a set of resources and
        ``minimal`` by resource without a bounds check; a snapshot is
        checksummed, not signed.
        """
        for name, array in (("directions", self.directions), ("minimal", self.minimal)):
            if not isinstance(array, np.ndarray) or array.dtype != np.float64:
                raise ValueError(f"{name} is not a float64 array")
            if array.ndim != 2 or array.shape[-1] != N_RESOURCES:
                raise ValueError(f"{name} has shape {array.shape}")
            if not array.flags.c_contiguous:
                raise ValueError(f"{name} is not C-contiguous")
        if len(self._ring) > self.window or not 0 <= self._next < max(self.window, 1):
            raise ValueError("the ring does not fit its window")
        if Counter(self._ring) != self._counts:
            raise ValueError("the shape counts do not match the ring")

    def add(self, shape: Shape) -> None:
        ring = self._ring
        if len(ring) < self.window:
            ring.append(shape)
            self._count_in(shape)
        else:
            at = self._next
            old = ring[at]
            # A pool's mix is a few shapes: the one leaving is often the one
            # coming in, and the counts stay as they are.
            if old != shape:
                counts = self._counts
                left = counts[old] - 1
                if left:
                    counts[old] = left
                else:
                    del counts[old]
                ring[at] = shape
                self._count_in(shape)
            at += 1
            self._next = 0 if at == self.window else at
        since = self._since_refresh = self._since_refresh + 1
        seen = self._seen = self._seen + 1
        every = self.refresh_every
        if since >= every or (seen < every and seen & (seen - 1) == 0):
            self.refresh()

    def _count_in(self, shape: Shape) -> None:
        counts = self._counts
        # ``get``, not Counter's ``+=``: a new shape would go through
        # ``__missing__``, a Python call on every placement's path.
        counts[shape] = counts.get(shape, 0) + 1

    def common(self) -> tuple[FloatArray, FloatArray]:
        """The ``max_shapes`` most common shapes of the window (shapes x resources) and
        their counts; empty arrays before the first request."""
        return most_common(self._counts, self.max_shapes)

    def refresh(self) -> None:
        self._since_refresh = 0
        shapes, weights = self.common()
        if len(shapes) == 0:
            self.directions = np.zeros((1 << N_RESOURCES, N_RESOURCES))
            self.minimal = np.zeros((0, N_RESOURCES))
            return
        self.directions = _fill_directions(shapes, weights)
        # smaller[i, j]: shape j is no larger than shape i anywhere and smaller
        # somewhere; shape i is dominated when any shape is smaller.
        below = shapes[np.newaxis, :, :] <= shapes[:, np.newaxis, :]
        under = shapes[np.newaxis, :, :] < shapes[:, np.newaxis, :]
        smaller = np.all(below, axis=2) & np.any(under, axis=2)
        dominated = np.any(smaller, axis=1)
        self.minimal = np.ascontiguousarray(shapes[~dominated])


# Row k: whether resource r is in bit set k, for every set of resources.
_SPARED: np.ndarray = np.array(
    [
        [bool((exhausted >> r) & 1) for r in range(N_RESOURCES)]
        for exhausted in range(1 << N_RESOURCES)
    ]
)


def _fill_directions(shapes: FloatArray, weights: FloatArray) -> FloatArray:
    """Row k: the count-weighted mean of the shapes asking nothing of the resources
    in bit set k (zeros where no shape does).

    Most sets keep the same shapes (where every shape asks for cores and
    memory, every set with either keeps none and the others keep all), so each
    distinct set of shapes is averaged once and its row copied: the same
    arithmetic on the same arrays, a few passes instead of sixteen.
    """
    directions = np.zeros((1 << N_RESOURCES, N_RESOURCES))
    asks = shapes > 0.0
    # keeps[k, i]: shape i asks nothing of the resources in set k.
    keeps = ~np.any(asks[np.newaxis, :, :] & _SPARED[:, np.newaxis, :], axis=2)
    means: dict[bytes, FloatArray | None] = {}
    for exhausted in range(1 << N_RESOURCES):
        keep = keeps[exhausted]
        seen = keep.tobytes()
        if seen not in means:
            total = weights[keep].sum()
            means[seen] = weights[keep] @ shapes[keep] / total if total > 0.0 else None
        mean = means[seen]
        if mean is not None:
            directions[exhausted] = mean
    return directions


# What the guard remembers of each host's waste before a placement: the free
# vector and inverse capacity it was measured on (2 x resources rows, hosts
# columns; NaN: never) and that waste (hosts). The waste is a function of
# those two vectors, the mix and the weighed resources, so an entry whose
# vectors still match is the host's waste now, as long as the mix and the
# weighed resources are those it was measured with: the guard forgets every
# entry when they change (``WasteGuard._memory_for``).
WasteMemory = tuple[FloatArray, FloatArray]


# No memory: every host's waste before the placement is measured anew.
NO_MEMORY: WasteMemory = (np.zeros((2 * N_RESOURCES, 0)), np.zeros(0))


@numba.njit(cache=True, nogil=True)
def waste_costs(
    free: FloatArray,
    inv_capacity: FloatArray,
    unschedulable: np.ndarray,
    n_hosts: int,
    demand: FloatArray,
    measure: WasteMeasure,
    out: FloatArray,
    memory: WasteMemory,
) -> float:
    """Each host's added waste ``waste(free - d) - waste(free)`` into ``out``; the least.

    Hosts that are unschedulable or where ``demand`` does not fit get inf.
    Returns the least cost over the hosts that fit (inf: none fits). Each
    host's waste before the placement is taken from ``memory`` where its
    vectors are the ones remembered, and remembered where not (the same number
    either way), when the memory has room for every host; ``NO_MEMORY``
    measures every host anew.
    """
    n_resources = free.shape[0]
    tolerance = measure[3]
    zero = np.zeros(n_resources)
    seen, remembered = memory
    remember = (
        remembered.shape[0] >= n_hosts
        and seen.shape[0] >= 2 * n_resources
        and seen.shape[1] >= n_hosts
    )
    best = np.inf
    for h in range(n_hosts):
        if unschedulable[h]:
            out[h] = np.inf
            continue
        fits = True
        for r in range(n_resources):
            if demand[r] > 0.0 and free[r, h] < demand[r] - tolerance:
                fits = False
                break
        if not fits:
            out[h] = np.inf
            continue
        if remember:
            after = leftover_waste(free, h, demand, inv_capacity, measure)
            same = True
            for r in range(n_resources):
                if free[r, h] != seen[r, h] or inv_capacity[r, h] != seen[n_resources + r, h]:
                    same = False
                    break
            if same:
                before = remembered[h]
            else:
                before = leftover_waste(free, h, zero, inv_capacity, measure)
                remembered[h] = before
                for r in range(n_resources):
                    seen[r, h] = free[r, h]
                    seen[n_resources + r, h] = inv_capacity[r, h]
            cost = after - before
        else:
            cost = added_waste(free, h, demand, zero, inv_capacity, measure)
        out[h] = cost
        best = min(best, cost)
    return best


@numba.njit(cache=True, nogil=True)
def guard_levels(out: FloatArray, n_hosts: int, best: float, step: float) -> None:
    """Replace each cost in ``out`` by its level; an unfit host (inf) becomes 0.

    Level 0 is every host whose cost is at most max(best, 0) + step, level k
    the next k steps. A host that adds no waste is always level 0: another
    host that would *repair* existing waste does not take the choice away
    from the levels below (that would force small CPU-heavy VMs onto
    memory-poor hosts whatever their lifetimes). Unfit hosts are the
    filters' business; their key only has to be finite.
    """
    base = max(best, 0.0)
    for h in range(n_hosts):
        cost = out[h]
        if cost == np.inf:
            out[h] = 0.0
        else:
            out[h] = max(0.0, np.ceil((cost - base) / step) - 1.0)


@numba.njit(cache=True, nogil=True)
def guard_keys(
    pool: WastePool,
    occupied: np.ndarray,
    n_hosts: int,
    demand: FloatArray,
    measure: WasteMeasure,
    step: float,
    out: FloatArray,
    memory: WasteMemory,
) -> None:
    """``waste_costs`` then ``guard_levels`` in one call (one dispatch per placement),
    each host's waste before the placement remembered in ``memory`` (``WasteMemory``).

    The level is measured from the least waste over the hosts that run VMs
    (``occupied[h] > 0``) when one of them fits: an empty host never sets
    the bar, so the guard does not refuse every used host whose fragment an
    empty one would spare, and spread the VMs over hosts that would have
    stayed empty.
    """
    free, inv_capacity, unschedulable, present = pool
    weights, directions, minimal, tolerance = measure
    used = present_weights(weights, present)
    measured = (used, directions, minimal, tolerance)
    best = waste_costs(free, inv_capacity, unschedulable, n_hosts, demand, measured, out, memory)
    best_used = np.inf
    for h in range(n_hosts):
        if occupied[h] > 0 and out[h] < best_used:
            best_used = out[h]
    if best_used < np.inf:
        best = best_used
    if best == np.inf:
        for h in range(n_hosts):
            out[h] = 0.0  # nothing fits: the filters say why
    else:
        guard_levels(out, n_hosts, best, step)


@numba.njit(cache=True, nogil=True)
def all_within(
    free: FloatArray,
    inv_capacity: FloatArray,
    present: np.ndarray,
    hosts: np.ndarray,
    count: int,
    also: int,
    demand: FloatArray,
    measure: WasteMeasure,
    step: float,
) -> bool:
    """Whether each of ``hosts[:count]``, and host ``also`` unless it is -1, adds at
    most ``step`` of waste.

    Such a host is at level 0 whatever the best host adds (level 0 reaches
    max(best, 0) + step), so an unguarded choice among them stands.
    """
    weights, directions, minimal, tolerance = measure
    used = (present_weights(weights, present), directions, minimal, tolerance)
    zero = np.zeros(free.shape[0])
    for i in range(count):
        cost = added_waste(free, hosts[i], demand, zero, inv_capacity, used)
        if cost > step:
            return False
    return also < 0 or added_waste(free, also, demand, zero, inv_capacity, used) <= step


def warm_up_waste() -> None:
    """Compile (or load from numba's cache) before the first placement is timed."""
    free = np.ones((N_RESOURCES, 1))
    present = np.ones(N_RESOURCES, dtype=np.bool_)
    demand = np.zeros(N_RESOURCES)
    measure = (
        np.ones(N_RESOURCES),
        np.ones((1 << N_RESOURCES, N_RESOURCES)),
        np.zeros((1, N_RESOURCES)),
        FIT_TOLERANCE,
    )
    guard_keys(
        (free, free, np.zeros(1, dtype=np.bool_), present),
        np.zeros(1, dtype=np.int32),
        1,
        demand,
        measure,
        1.0,
        np.zeros(1),
        (np.full((2 * N_RESOURCES, 1), np.nan), np.zeros(1)),
    )


class WasteGuard(NumpyScorer):
    """The waste level of each host (0: within ``tolerance`` of the least waste), above ``below``.

    ``below`` is a preference that the guard outranks (the deployment affinity,
    LAVA's, or both in one key); its costs are
    packed under the level in one key, so the compiled lifetime scan still
    sees one preference. With no mix yet (the pool's first request), every
    host is level 0: nothing is known to strand. A host's waste before a
    placement is half of each level's work and changes only with the host,
    the mix or the pool's resources, so the guard remembers it
    (``WasteMemory``).
    """

    name = "waste"

    def __init__(
        self,
        mix: RequestMix,
        tolerance: float,
        weights: FloatArray,
        below: ScorePlugin | None = None,
    ) -> None:
        if not tolerance > 0:
            raise ValueError(f"tolerance must be > 0, got {tolerance}")
        self.mix = mix
        self.tolerance = tolerance
        self.weights = np.ascontiguousarray(weights, dtype=np.float64)
        self.below = below
        self._demand = np.zeros(N_RESOURCES)
        self._below_out: FloatArray = np.zeros(0)
        self._last_seen: tuple[str, float] | None = None
        # Each host's waste before a placement, remembered (``_memory_for``):
        # measured against the mix's directions array it names and the
        # pool's resources as they were.
        self._seen: FloatArray = np.zeros((2 * N_RESOURCES, 0))
        self._remembered: FloatArray = np.zeros(0)
        self._measured_with: FloatArray | None = None
        self._present: np.ndarray = np.zeros(N_RESOURCES, dtype=np.bool_)
        warm_up_waste()

    def observe(self, request: PlacementRequest) -> None:
        """Count ``request`` in the mix, once however many times it is scored.

        A lifetime policy may score one request twice (its compiled scan, then
        the pipeline that explains why nothing fits); the mix must not depend
        on which path a placement took.
        """
        seen = (request.vm_id, request.now)
        if seen != self._last_seen:
            self._last_seen = seen
            self.mix.add(request.demand)

    def levels(self, cluster: ClusterState, request: PlacementRequest, out: FloatArray) -> None:
        """Each host's waste level for ``request`` into ``out[:n_hosts]`` (no preference)."""
        n = cluster.n_hosts
        mix = self.mix
        if not mix.known:
            out[:n] = 0.0
            return
        demand = self._demand
        demand[:] = request.demand
        pool = (cluster.free, cluster.inv_capacity, cluster.unschedulable, cluster.resource_present)
        measure = self._measure()
        memory = self._memory_for(cluster)
        guard_keys(pool, cluster.vm_count, n, demand, measure, self.tolerance, out, memory)

    def _memory_for(self, cluster: ClusterState) -> WasteMemory:
        """The memory of each host's waste (``WasteMemory``), with room for every host of
        ``cluster`` and forgotten if the mix was refreshed or the pool's resources
        changed since it was written. Checked whole at each call (shapes, dtypes),
        so a memory restored from a snapshot cannot make the kernel read past it."""
        mix = self.mix
        seen, remembered = self._seen, self._remembered
        columns = cluster.free.shape[1]
        fits = (
            isinstance(seen, np.ndarray)
            and isinstance(remembered, np.ndarray)
            and seen.dtype == np.float64
            and remembered.dtype == np.float64
            and seen.ndim == 2
            and remembered.ndim == 1
            and seen.shape[0] == 2 * N_RESOURCES
            and seen.shape[1] >= columns
            and remembered.shape[0] >= columns
            and seen.flags.c_contiguous
            and remembered.flags.c_contiguous
        )
        if not fits:
            # The pool's columns: they grow by doubling, so this does too.
            size = max(columns, 64)
            seen = self._seen = np.full((2 * N_RESOURCES, size), np.nan)
            remembered = self._remembered = np.zeros(size)
        elif self._measured_with is not mix.directions or not np.array_equal(
            self._present, cluster.resource_present
        ):
            seen.fill(np.nan)
        else:
            return seen, remembered
        self._measured_with = mix.directions
        self._present = cluster.resource_present.copy()
        return seen, remembered

    def scan_test(self) -> GuardTest:
        """The guard's test of a lifetime scan's choice, made in the scan's own call
        (``lifetime_scan``, ``all_within``): not run while the mix is unknown, as then
        every host is level 0."""
        mix = self.mix
        if not mix.known:
            return NO_GUARD_TEST
        return self._measure(), self.tolerance, True

    def _measure(self) -> WasteMeasure:
        """How the guard measures waste against the mix as it stands (its last refresh)."""
        mix = self.mix
        return self.weights, mix.directions, mix.minimal, FIT_TOLERANCE

    def pack(self, levels: FloatArray, below: FloatArray | None, out: FloatArray) -> None:
        """The key of level then preference, level * stride + preference, into ``out``.

        ``levels`` is overwritten; ``out`` may be ``below`` itself.
        """
        np.multiply(levels, _LEVEL_STRIDE, out=levels)
        if below is None:
            np.copyto(out, levels)
        else:
            np.add(levels, below, out=out)

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        n = cluster.n_hosts
        self.observe(request)
        self.levels(cluster, request, out)
        below = self.below
        if below is not None:
            if len(self._below_out) < n:
                self._below_out = np.zeros(max(n, 2 * len(self._below_out), 64))
            mine = self._below_out[:n]
            below.score(cluster, request, mine, scratch)
            self.pack(out[:n], mine, out[:n])
