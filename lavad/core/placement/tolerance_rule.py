"""A pool's LAS cost tolerance, set from the CPU the pool strands.

Which tolerance keeps more of the oracle's gain follows how much the pool
strands: where hosts strand almost nothing (memory to spare for the request
mix), ranking lifetimes more finely gains, since Best Fit's wider choice has
little to pack better; where they strand more, the wider tie lets Best Fit
keep fragments down and wins (docs/results/placement-matrix.md, "Half the
tolerance, 0.125"). So the pool measures what it strands, as the reported
metric does (``metrics.stranding.inflate``: the hosts filled with the
recent request mix until nothing fits), once an hour of event time, and
ranks at the fine tolerance while the mean of its last day of samples is
below ``below_pct`` of the CPU measured ("A tolerance each pool sets from
what it strands" there).

By default it reads the hosts in use alone, where the metric reads every
schedulable host: an empty host, filled with the mix, strands next to
nothing, so a fleet's spare hosts would thin the figure by how much spare
the fleet keeps, and the same pool would rank differently with 5% or 15%
headroom ("Read over the hosts in use" there). An hour with nothing in
use takes no sample.

The rule reads the pool's own state, never a trace's label, so it follows
a pool whose load moves from one regime to the other, and a restored
snapshot carries its samples and its generator.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from lavad.core.cluster import ClusterState
from lavad.core.metrics.pool import CORES
from lavad.core.metrics.stranding import inflate_schedulable
from lavad.core.placement.lifetime import LasTemporalCost
from lavad.core.placement.waste import RequestMix

# An hour of event time between samples, and a day of them averaged: a
# pool's stranding follows its daily load, so a day's mean does not switch
# the tolerance with the hour.
SAMPLE_EVERY_S = 3600.0
SAMPLES = 24
# The inflation's draws are the rule's own, so sampling never moves the
# policy's tie draws.
_SEED = 0x5EED


class StrandingTolerance:
    """Sets ``las.tie_tolerance`` to ``fine`` or ``coarse`` buckets per quantile pair."""

    def __init__(
        self,
        las: LasTemporalCost,
        mix: RequestMix,
        *,
        fine: float,
        coarse: float,
        below_pct: float,
        in_use_only: bool,
    ) -> None:
        if not 0 <= fine <= coarse:
            raise ValueError(f"need 0 <= fine <= coarse, got {fine} and {coarse}")
        if not below_pct > 0:
            raise ValueError(f"below_pct must be > 0, got {below_pct}")
        self.las = las
        self.mix = mix
        # The scorer's tolerance is in the cost's units: buckets per pair times pairs.
        self.fine = fine * las.pairs
        self.coarse = coarse * las.pairs
        self.below_pct = below_pct
        self.in_use_only = in_use_only
        self.samples: deque[float] = deque(maxlen=SAMPLES)
        self.next_sample = -np.inf
        self.rng = np.random.default_rng(_SEED)
        las.tie_tolerance = self.fine

    def update(self, cluster: ClusterState, now: float) -> None:
        """Take a sample when one is due (one per call, however far time jumped)."""
        if now < self.next_sample:
            return
        self.next_sample = now + SAMPLE_EVERY_S
        stranded = self._stranded_cpu_pct(cluster)
        if stranded is None:
            return
        samples = self.samples
        samples.append(stranded)
        mean = sum(samples) / len(samples)
        self.las.tie_tolerance = self.fine if mean < self.below_pct else self.coarse

    def _stranded_cpu_pct(self, cluster: ClusterState) -> float | None:
        """The CPU of the hosts read (``in_use_only``: those running a VM) that no
        request of the mix fits after inflation, in %; None before the pool has such
        hosts or a mix."""
        if cluster.n_hosts == 0:
            return None
        shapes, weights = self.mix.common()
        if len(shapes) == 0:
            return None
        inflated = inflate_schedulable(
            cluster, shapes, weights, self.rng, in_use_only=self.in_use_only
        )
        capacity = float(inflated.capacity[CORES])
        if capacity <= 0:
            return None
        return 100.0 * float(inflated.left[CORES]) / capacity
