"""Per host column: the sums of its VMs' usage means and variances, in absolute units.

Assuming independent VMs, a host's total usage has mean sum(mu_i) and
variance sum(sigma_i^2) (the GPA paper's estimate), so a fit test needs only
these two sums per host and resource (and the sums of third and fourth
cumulants, for the Cornish-Fisher percentile of ``tail.py``). They are kept like the free capacity
in ``core/cluster.py``: one column per host, changed in O(1) when a VM is
placed, leaves, or its estimate moves with a new sample, never recomputed
from the VM list.

Units: ``UsageMoments`` holds fractions of each VM's request; a VM placed
with ``scale = (cores, memory_gib)`` adds mean * scale and variance * scale^2.
Until a VM has ``prior.min_samples`` observations of a resource, it adds the
prior instead (by default its whole request, with no variance: the hard fit
on the request), so a VM is overcommitted only once its usage is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from lavad.models.argument_checks import require_at_least
from lavad.models.arrays import FloatArray
from lavad.models.recency import touch
from lavad.models.usage.moments import CPU, N_USAGE, UsageMoments
from lavad.streams.schema import UsageSample

Scale = tuple[float, float]
# (mean cpu, mean memory, variance cpu, variance memory, third cumulant cpu,
# third memory, fourth cumulant cpu, fourth memory), absolute units.
Contribution = tuple[float, float, float, float, float, float, float, float]
# Offsets of each moment in a Contribution (index + resource).
MEAN, VARIANCE, THIRD, FOURTH = 0, 2, 4, 6


@dataclass(frozen=True, slots=True)
class UsagePrior:
    """What a VM with too few observations is taken to use, as fractions of its request."""

    mean_fraction: float = 1.0
    variance_fraction: float = 0.0
    min_samples: int = 12

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_fraction) and self.mean_fraction >= 0):
            raise ValueError(f"mean_fraction must be >= 0, got {self.mean_fraction}")
        if not (math.isfinite(self.variance_fraction) and self.variance_fraction >= 0):
            raise ValueError(f"variance_fraction must be >= 0, got {self.variance_fraction}")
        require_at_least(1, min_samples=self.min_samples)


@dataclass(slots=True)
class _Placement:
    host: int
    scale: Scale
    # Exactly what was added to the host's sums, so removal gives it back.
    added: Contribution
    # Counted by its own CPU estimate (not the prior) since it last changed.
    estimated: bool


# VMs with usage state but no placement (a sample before its VM.request,
# an evicted VM waiting to come back) kept at most, oldest sample first out.
MAX_UNPLACED = 10_000


class HostUsage:
    """Sums of usage means and variances per host column, fed by a ``UsageMoments``.

    The usage stream names VMs: a placed VM's state is bounded by the pool,
    but samples for VMs that are not (or no longer) placed would grow it
    without bound. Those are kept in least-recently-sampled order, at most
    ``max_unplaced`` of them; past that the oldest one's moments are
    forgotten and counted in ``evicted`` (it starts again from the prior if
    it is ever placed).
    """

    def __init__(
        self,
        moments: UsageMoments,
        prior: UsagePrior | None = None,
        initial_columns: int = 256,
        max_unplaced: int = MAX_UNPLACED,
    ) -> None:
        if max_unplaced < 0:
            raise ValueError(f"max_unplaced must be >= 0, got {max_unplaced}")
        self.max_unplaced = max_unplaced
        # Insertion order is the eviction order (a dict keeps it).
        self._unplaced: dict[str, None] = {}
        self.evicted = 0
        self.moments = moments
        self.prior = prior or UsagePrior()
        columns = max(1, initial_columns)
        self.mean_sum: FloatArray = np.zeros((N_USAGE, columns))
        self.variance_sum: FloatArray = np.zeros((N_USAGE, columns))
        # Sums of third and fourth cumulants (they add over independent VMs
        # too): the Cornish-Fisher percentile's skewness and kurtosis.
        self.third_sum: FloatArray = np.zeros((N_USAGE, columns))
        self.fourth_sum: FloatArray = np.zeros((N_USAGE, columns))
        # VMs per host still counted by the prior on CPU: a host's promise
        # can be checked against its realised usage only when this is 0.
        self.prior_count: NDArray[np.int32] = np.zeros(columns, dtype=np.int32)
        self.vm_count: NDArray[np.int32] = np.zeros(columns, dtype=np.int32)
        self._placed: dict[str, _Placement] = {}
        # Per resource, how much wider a host's usage sum really varies than
        # the sum of its VMs' variances says (>= 1; covariance among
        # co-located VMs). Learned from realised usage by the policy's hooks;
        # every reader of the variance sums applies it.
        self.variance_factor: FloatArray = np.ones(N_USAGE)

    def __contains__(self, vm_id: object) -> bool:
        return vm_id in self._placed

    @property
    def unplaced(self) -> int:
        """VMs with usage history and no placement (at most ``max_unplaced``)."""
        return len(self._unplaced)

    def host_of(self, vm_id: str) -> int | None:
        placement = self._placed.get(vm_id)
        return None if placement is None else placement.host

    def ensure_columns(self, n_hosts: int) -> None:
        """Make room for host columns 0..n_hosts-1 (hosts join the cluster at any time)."""
        columns = self.mean_sum.shape[1]
        if n_hosts <= columns:
            return
        size = max(n_hosts, 2 * columns)

        def widen(array: FloatArray) -> FloatArray:
            grown: FloatArray = np.zeros((N_USAGE, size))
            grown[:, :columns] = array
            return grown

        def widen_count(array: NDArray[np.int32]) -> NDArray[np.int32]:
            grown: NDArray[np.int32] = np.zeros(size, dtype=np.int32)
            grown[:columns] = array
            return grown

        self.mean_sum = widen(self.mean_sum)
        self.variance_sum = widen(self.variance_sum)
        self.third_sum = widen(self.third_sum)
        self.fourth_sum = widen(self.fourth_sum)
        self.vm_count = widen_count(self.vm_count)
        self.prior_count = widen_count(self.prior_count)

    # ------------------------------------------------------------ estimates

    def contribution(self, vm_id: str, scale: Scale) -> Contribution:
        """What ``vm_id`` of request ``scale`` adds to a host: its estimate, or the prior."""
        prior = self.prior
        means = [prior.mean_fraction * scale[0], prior.mean_fraction * scale[1]]
        variances = [
            prior.variance_fraction * scale[0] ** 2,
            prior.variance_fraction * scale[1] ** 2,
        ]
        thirds = [0.0, 0.0]
        fourths = [0.0, 0.0]
        moments = self.moments
        slot = moments.slot(vm_id)
        if slot is not None:
            for resource in range(N_USAGE):
                if moments.samples(slot, resource) >= prior.min_samples:
                    size = scale[resource]
                    means[resource] = float(moments.mean[resource, slot]) * size
                    variances[resource] = moments.variance_at(slot, resource) * size * size
                    third, fourth = moments.cumulants_at(slot, resource)
                    thirds[resource] = third * size**3
                    fourths[resource] = fourth * size**4
        return (
            means[0],
            means[1],
            variances[0],
            variances[1],
            thirds[0],
            thirds[1],
            fourths[0],
            fourths[1],
        )

    # -------------------------------------------------------------- updates

    def place(self, vm_id: str, host: int, scale: Scale) -> None:
        if vm_id in self._placed:
            raise ValueError(f"VM {vm_id!r} is already placed on host column {host}")
        if host < 0:
            raise ValueError(f"host column must be >= 0, got {host}")
        self.ensure_columns(host + 1)
        self._unplaced.pop(vm_id, None)
        added = self.contribution(vm_id, scale)
        self._add(host, added, 1.0)
        self.vm_count[host] += 1
        estimated = self.estimated(vm_id, CPU)
        self.prior_count[host] += not estimated
        self._placed[vm_id] = _Placement(host, scale, added, estimated)

    def remove(self, vm_id: str) -> int | None:
        """Take a VM off its host; returns the host column (None if it was not placed)."""
        placement = self._placed.pop(vm_id, None)
        if placement is None:
            return None
        host = placement.host
        if vm_id in self.moments:
            self._keep_unplaced(vm_id)  # its history stays, unplaced, until forgotten
        self.vm_count[host] -= 1
        self.prior_count[host] -= not placement.estimated
        if self.vm_count[host]:
            self._add(host, placement.added, -1.0)
        else:
            # Snap to zero: no rounding residue survives an empty host.
            self.mean_sum[:, host] = 0.0
            self.variance_sum[:, host] = 0.0
            self.third_sum[:, host] = 0.0
            self.fourth_sum[:, host] = 0.0
        return host

    def refresh(self, vm_id: str) -> int | None:
        """Move a placed VM's share of its host's sums to its current estimate."""
        placement = self._placed.get(vm_id)
        if placement is None:
            return None
        now = self.contribution(vm_id, placement.scale)
        before = placement.added
        if now != before:
            host = placement.host
            self._add(host, before, -1.0)
            self._add(host, now, 1.0)
            placement.added = now
        if not placement.estimated and self.estimated(vm_id, CPU):
            placement.estimated = True
            self.prior_count[placement.host] -= 1
        return placement.host

    def observe(self, sample: UsageSample) -> int | None:
        """Feed a usage sample to the moments and the sums; returns the VM's host column."""
        self.moments.observe_sample(sample)
        host = self.refresh(sample.vm_id)
        if host is None:
            self._keep_unplaced(sample.vm_id)
        return host

    def forget(self, vm_id: str) -> bool:
        """Drop an unplaced VM's usage history (it exited); False if there was none."""
        self._unplaced.pop(vm_id, None)
        return self.moments.forget(vm_id)

    def _keep_unplaced(self, vm_id: str) -> None:
        for oldest in touch(self._unplaced, vm_id, self.max_unplaced):
            self.moments.forget(oldest)
            self.evicted += 1

    def _add(self, host: int, contribution: Contribution, sign: float) -> None:
        for resource in range(N_USAGE):
            self.mean_sum[resource, host] += sign * contribution[MEAN + resource]
            self.variance_sum[resource, host] += sign * contribution[VARIANCE + resource]
            self.third_sum[resource, host] += sign * contribution[THIRD + resource]
            self.fourth_sum[resource, host] += sign * contribution[FOURTH + resource]

    # -------------------------------------------------------------- readers

    def variance(self, resource: int, n_hosts: int) -> FloatArray:
        """Variance sums of hosts 0..n_hosts-1 times ``variance_factor``, clipped at 0.

        (Subtraction can leave -1e-18.)
        """
        self.ensure_columns(n_hosts)
        clipped: FloatArray = np.maximum(self.variance_sum[resource, :n_hosts], 0.0)
        scaled: FloatArray = clipped * self.variance_factor[resource]
        return scaled

    def estimated(self, vm_id: str, resource: int) -> bool:
        """Whether the VM counts by its own estimate (enough samples), not the prior."""
        slot = self.moments.slot(vm_id)
        return slot is not None and self.moments.samples(slot, resource) >= self.prior.min_samples
