"""The placement pipeline: filter plugins -> lexicographic score plugins -> seeded tie-break.

Plugins are small Protocols, in the spirit of the Kubernetes scheduler
framework. Filters set ``blocked[h]`` for every host h they reject; scorers
write one float per host (lower is better) and apply lexicographically: the
first scorer decides, the next only separates the first one's ties.

Speed: a policy made of the default filters and one scorer with a compiled
kernel (Best Fit, First Fit) runs as a single compiled scan over the hosts
(``kernels.py``), bit-identical to this pipeline; a request's anti-affinity
reaches the scan as the hosts at its deployment's limit, marked unschedulable
for that request (``unschedulable_for``). Everything else runs here:
a dozen vectorised operations over all hosts, where numpy's per-call overhead
decides the latency, so plugins write into buffers the policy owns (``out=``),
blocked hosts are masked with one ``copyto`` rather than gathered, and only
the final tie set, usually a handful of hosts, is turned into indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias

import numpy as np

from lavad.core.cluster import (
    FIT_TOLERANCE,
    N_RESOURCES,
    RESOURCES,
    BoolArray,
    ClusterState,
    FloatArray,
    IntArray,
    VmRecord,
)
from lavad.core.placement.kernels import Direct, ScanPool
from lavad.streams.schema import UsageSample, VmPlaced, VmRequest

# The per-request value types below are not frozen: a frozen dataclass sets
# each field through object.__setattr__, which costs more per placement than
# the compiled host scan. Nothing keeps them beyond one placement.


# What booked a VM on a host: its request (placed by this policy), another
# scheduler's placement (VmPlaced), or nothing (a restored or test booking).
Booking: TypeAlias = VmRequest | VmPlaced | None


@dataclass(slots=True)
class PlacementRequest:
    """What the pipeline needs to know about a VM asking for a host."""

    vm_id: str
    demand: tuple[float, float, float, float]
    deployment: str
    max_per_host: int | None
    now: float
    # The request itself, for policies that predict from its features.
    event: VmRequest | None = None

    @property
    def requested_resources(self) -> tuple[int, ...]:
        return tuple(r for r in range(N_RESOURCES) if self.demand[r])


@dataclass(slots=True)
class Placed:
    host: int
    # How many hosts shared the best score (the seeded draw chose among them).
    ties: int
    scores: dict[str, float]


@dataclass(slots=True)
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

    def apply(self, cluster: ClusterState, request: PlacementRequest, blocked: BoolArray) -> None:
        """Set ``blocked[h]`` for every host h that cannot take ``request`` (never clear it)."""


class NumpyScorer:
    """A score plugin's defaults: no compiled kernel, scored by numpy only.

    A scorer with a kernel (Best Fit, First Fit) sets ``kernel`` and
    ``kernel_weights`` itself; the others inherit these.
    """

    kernel: int | None = None
    kernel_weights: FloatArray = np.ones(N_RESOURCES)
    tie_tolerance: float = 0.0


class StackedScorer(NumpyScorer):
    """A numpy scorer that can write its costs added to a level packed above it.

    A scorer packing its level above another's (the deployment affinity above
    LAVA's preference) would otherwise have it score the pool, then add its
    levels in a second pass over every host at each placement.
    """

    def score_onto(
        self, cluster: ClusterState, request: PlacementRequest, base: FloatArray, out: FloatArray
    ) -> None:
        """``base[h]`` plus this scorer's cost of host h, into ``out[h]``, for each of the
        first ``cluster.n_hosts`` hosts; ``out`` may be ``base``."""
        raise NotImplementedError


class ScorePlugin(Protocol):
    name: str

    @property
    def kernel(self) -> int | None:
        """The compiled kernel computing this scorer with the default filters, if any.

        ``kernels.BESTFIT``, ``kernels.FIRSTFIT``; None for the numpy path only.
        """

    @property
    def kernel_weights(self) -> FloatArray:
        """Per-resource weights for the kernel (resources no host has are skipped)."""

    @property
    def tie_tolerance(self) -> float:
        """Hosts scoring at most this above the level's best tie with it (0: only equal ones)."""

    def score(
        self, cluster: ClusterState, request: PlacementRequest, out: FloatArray, scratch: FloatArray
    ) -> None:
        """Write one score per host column into ``out`` (length ``cluster.n_hosts``).

        Lower is better; blocked hosts' values are ignored. ``scratch`` is a
        buffer of the same length the scorer may overwrite.
        """


def scan_pool(cluster: ClusterState, scorer: ScorePlugin) -> ScanPool:
    """The pool as the compiled scans take it: the cluster's arrays, ``scorer``'s weights."""
    return (
        cluster.free,
        cluster.inv_capacity,
        cluster.unschedulable,
        cluster.resource_present,
        scorer.kernel_weights,
    )


@dataclass(slots=True)
class Notice:
    """A change a policy reports: the engine publishes it as a reprediction decision."""

    time: float
    subject: Literal["vm", "host"]
    subject_id: str
    reason: str
    explanation: dict[str, Any]


class PredictedLifetimes(Protocol):
    """A policy's VM lifetime predictions as the migration planner reads them (the
    lifetime tracker offers them; declared here so the framework need not import it)."""

    def refresh(self, cluster: ClusterState, now: float) -> None:
        """Bring the predictions up to ``now`` (the repredictions due by then)."""
        ...

    def remaining(self, vm_id: str, now: float) -> float:
        """The VM's predicted remaining lifetime at ``now`` (0 when overdue)."""
        ...


class ClusterListener:
    """What the engine tells a pool's stateful parts, with no-op defaults.

    A policy's hooks (lifetime trackers, LAVA's host states, GPA's usage sums)
    and the migration planner's lifetime sources are listeners: each
    overrides what it needs, and the engine calls every method on every
    listener with no ``None`` checks or type tests.

    Timers: the engine calls ``advance(cluster, now)`` once event time reaches
    ``next_deadline``, before the pool's next event, so a replay and the live
    daemon fire them at the same points. What changed is reported as notices,
    which the engine takes after each event and each advance.
    """

    # Whether ``observe`` learns from the usage stream; the engine counts a
    # usage sample nobody learns from (and no limits are on) as unconsumed.
    observes_usage = False

    @property
    def next_deadline(self) -> float:
        """The earliest time ``advance`` has work to do (inf: none)."""
        return float("inf")

    def advance(self, cluster: ClusterState, now: float) -> None:
        """Run every timer due by ``now``, in time order."""
        return

    def take_notices(self) -> list[Notice]:
        """The changes reported since the last call, in time order (and forget them)."""
        return []

    def on_booked(
        self, cluster: ClusterState, record: VmRecord, now: float, event: Booking
    ) -> None:
        """A VM was booked: placed by this policy (VmRequest) or by another (VmPlaced)."""
        return

    def on_released(
        self, cluster: ClusterState, record: VmRecord, now: float, *, exited: bool
    ) -> None:
        """A VM left its host: ``exited`` (it ended) or not (evicted by a host going down)."""
        return

    def on_moved(
        self, cluster: ClusterState, before: VmRecord, after: VmRecord, now: float
    ) -> None:
        """A running VM was live-migrated: ``before`` on its old host, ``after`` booked on the new.

        Neither an exit nor a new VM: its start time, history and predictions carry over.
        """
        return

    def observe(self, cluster: ClusterState, sample: UsageSample) -> None:
        """One measured usage sample of a VM (placed here or not yet)."""
        return

    def summary(self) -> dict[str, Any]:
        """Figures for the replay summary, under the listener's own keys."""
        return {}

    def lifetime_tracker(self) -> PredictedLifetimes | None:
        """The VM lifetime predictions this listener keeps, for the migration planner."""
        return None


# A policy that keeps no state of its own listens with the defaults.
PlacementHooks = ClusterListener


# ------------------------------------------------------------------ filters


class SchedulableFilter:
    """Only hosts that are up, not draining, and below their VM limit receive VMs."""

    name = "schedulable"

    def apply(self, cluster: ClusterState, request: PlacementRequest, blocked: BoolArray) -> None:
        np.logical_or(blocked, cluster.unschedulable[: cluster.n_hosts], out=blocked)


class FitFilter:
    """Hard fit: every requested resource fits in the host's free capacity."""

    name = "fit"

    def apply(self, cluster: ClusterState, request: PlacementRequest, blocked: BoolArray) -> None:
        n = cluster.n_hosts
        free = cluster.free
        demand = request.demand
        for r in range(N_RESOURCES):
            amount = demand[r]
            if amount:
                np.logical_or(blocked, free[r, :n] < amount - FIT_TOLERANCE, out=blocked)


class AntiAffinityFilter:
    """At most ``max_per_host`` VMs of one deployment on a host."""

    name = "anti_affinity"

    def apply(self, cluster: ClusterState, request: PlacementRequest, blocked: BoolArray) -> None:
        limit = request.max_per_host
        if limit is None or not request.deployment:
            return
        per_host = cluster.deployment_hosts.get(request.deployment)
        if not per_host:
            return
        for host, count in per_host.items():
            if count >= limit:
                blocked[host] = True


DEFAULT_FILTERS: tuple[FilterPlugin, ...] = (SchedulableFilter(), FitFilter(), AntiAffinityFilter())


def unschedulable_for(
    cluster: ClusterState, request: PlacementRequest, buffer: BoolArray
) -> BoolArray:
    """The hosts a compiled scan must pass over for ``request``: the pool's
    unschedulable hosts and, under anti-affinity, those already holding
    ``max_per_host`` VMs of its deployment (``AntiAffinityFilter``'s rule), so a
    scan that applies the other default filters itself decides as the pipeline.

    The pool's own array when no host is at the limit; else a copy in
    ``buffer`` (at least ``n_hosts`` long), whose filling is bounded by the
    deployment's hosts, not the pool's.
    """
    limit = request.max_per_host
    per_host = cluster.deployment_hosts.get(request.deployment) if request.deployment else None
    if limit is None or not per_host:
        return cluster.unschedulable
    full = [host for host, count in per_host.items() if count >= limit]
    if not full:
        return cluster.unschedulable
    n = cluster.n_hosts
    np.copyto(buffer[:n], cluster.unschedulable[:n])
    buffer[full] = True
    return buffer


# ------------------------------------------------------------------- policy


class UniformDraws:
    """Seeded uniform draws, taken from the generator a block at a time.

    ``Generator.integers`` costs ~1.5 us a call, as much as a whole placement
    scan; a block of floats costs that once per 4,096 draws. The sequence
    depends only on the seed, so replays stay deterministic.
    """

    BLOCK = 4096

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._block: list[float] = []
        self._next = 0

    def index(self, count: int) -> int:
        """A uniform integer in [0, count)."""
        if self._next == len(self._block):
            self._block = self._rng.random(self.BLOCK).tolist()
            self._next = 0
        value = self._block[self._next]
        self._next += 1
        return min(int(value * count), count - 1)


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
        compiled: bool = True,
    ) -> None:
        self.name = name
        self.filters = filters
        self.scorers = scorers
        self.rng = rng
        self._draw = UniformDraws(rng)
        self.random_ties = random_ties
        # A policy without state of its own listens with the no-op defaults.
        self.hooks: ClusterListener = hooks if hooks is not None else ClusterListener()
        self._blocked: BoolArray = np.zeros(0, dtype=np.bool_)
        self._key: FloatArray = np.zeros(0)
        self._scratch: FloatArray = np.zeros(0)
        self._ties: IntArray = np.zeros(0, dtype=np.int64)
        only = scorers[0] if len(scorers) == 1 else None
        self._kernel = (
            only.kernel if compiled and only is not None and filters == DEFAULT_FILTERS else None
        )

    def _grow_buffers(self, n: int) -> None:
        """The per-host buffers (and ``_ties``) with room for ``n`` hosts."""
        if len(self._key) < n:
            size = max(n, 2 * len(self._key), 64)
            self._blocked = np.zeros(size, dtype=np.bool_)
            self._key = np.zeros(size)
            self._scratch = np.zeros(size)
            self._ties = np.zeros(size, dtype=np.int64)

    def _buffers(self, n: int) -> tuple[BoolArray, FloatArray, FloatArray]:
        self._grow_buffers(n)
        return self._blocked[:n], self._key[:n], self._scratch[:n]

    def place(self, cluster: ClusterState, request: PlacementRequest) -> PlacementResult:
        n = cluster.n_hosts
        if n == 0:
            return Unfit("the pool has no hosts", retryable=True)
        if self._kernel is not None:
            self._grow_buffers(n)
            unschedulable = unschedulable_for(cluster, request, self._blocked)
            return self._place_compiled(cluster, request, self._kernel, unschedulable)
        blocked, key, scratch = self._buffers(n)
        blocked.fill(False)
        for plugin in self.filters:
            plugin.apply(cluster, request, blocked)
        scores: dict[str, float] = {}
        best = np.inf
        for level, scorer in enumerate(self.scorers):
            if level:
                # Only the previous level's ties go on to this level.
                np.not_equal(key, best, out=blocked)
            scorer.score(cluster, request, key, scratch)
            np.copyto(key, np.inf, where=blocked)
            best = float(key[int(key.argmin())])
            if best == np.inf:
                return self._explain_unfit(cluster, request)
            tolerance = scorer.tie_tolerance
            if tolerance > 0.0:
                np.copyto(key, best, where=key <= best + tolerance)
            scores[scorer.name] = best
        ties = np.flatnonzero(key == best)
        if len(ties) == 1 or not self.random_ties:
            host = int(ties[0])
        else:
            host = int(ties[self._draw.index(len(ties))])
        return Placed(host=host, ties=len(ties), scores=scores)

    def _place_compiled(
        self,
        cluster: ClusterState,
        request: PlacementRequest,
        kernel: int,
        unschedulable: BoolArray,
    ) -> PlacementResult:
        scorer = self.scorers[0]
        d0, d1, d2, d3 = request.demand
        free, inv_capacity, _, present, weights = scan_pool(cluster, scorer)
        pool = (free, inv_capacity, unschedulable, present, weights)
        fit = (cluster.n_hosts, d0, d1, d2, d3, FIT_TOLERANCE)
        count, best = Direct.filter_and_score(pool, fit, kernel, self._ties)
        if count == 0:
            return self._explain_unfit(cluster, request)
        return Placed(host=self._tied_host(count), ties=count, scores={scorer.name: best})

    def _tied_host(self, count: int) -> int:
        """The host chosen among a compiled scan's ``count`` ties (``_ties[:count]``)."""
        if count == 1 or not self.random_ties:
            return int(self._ties[0])
        return int(self._ties[self._draw.index(count)])

    def _explain_unfit(self, cluster: ClusterState, request: PlacementRequest) -> Unfit:
        """Kubernetes-style "0/N hosts fit: a by fit, b by ..." (failure path only)."""
        n = cluster.n_hosts
        blocked = np.zeros(n, dtype=np.bool_)
        rejected: dict[str, int] = {}
        for plugin in self.filters:
            before = int(np.count_nonzero(blocked))
            plugin.apply(cluster, request, blocked)
            rejected[plugin.name] = int(np.count_nonzero(blocked)) - before
        if not cluster.fits_capacity(request.demand).any():
            asked = ", ".join(
                f"{RESOURCES[r]}={request.demand[r]:g}" for r in request.requested_resources
            )
            return Unfit(
                f"larger than any host in the pool ({asked})", retryable=False, rejected_by=rejected
            )
        detail = ", ".join(f"{count} by {name}" for name, count in rejected.items() if count)
        full = int(np.count_nonzero(cluster.vm_count[:n] >= cluster.max_vms))
        if full:
            # The schedulable filter counts them: say which of its hosts are only full.
            detail += f" ({full} at hosts.max_vms = {cluster.max_vms} VMs)"
        return Unfit(f"0/{n} hosts fit: {detail}", retryable=True, rejected_by=rejected)
