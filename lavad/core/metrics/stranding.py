"""Resource stranding by an inflation simulation (LAVA paper, section 2.3).

"We take a representative mix of VMs and simulate scheduling as many of them
as possible until capacity is exhausted. The remaining resources on hosts
represent stranded resources that cannot fit new VMs."

The mix is the shapes of the pool's recent requests, weighted by how often
each was asked for. The simulation fills every schedulable host of a copy of
the free-capacity arrays: in each round every host that still fits some shape
of the mix draws one of those shapes (seeded, by weight) and takes copies of
it; a host leaves the simulation when no shape of the mix fits it. The end
state is the paper's: nothing in the mix fits anywhere. Choices we made:

* Hosts are filled independently, each by its own seeded random stream, in
  one compiled pass (numba), rather than one VM at a time through the
  placement policy: the terminal condition is the same, and the cost falls
  from O(VMs x hosts) to O(rounds x shapes x hosts), which keeps hourly
  sampling cheap on 10^4 hosts and over traces that span months.
* A host takes half of the copies of the drawn shape that would fit (at least
  one), so hosts with room for thousands of tiny pods converge in a
  logarithmic number of rounds; the mix still decides what is left over.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import numba
import numpy as np

from lavad.core.cluster import FIT_TOLERANCE, N_RESOURCES, ClusterState, FloatArray


@dataclass(frozen=True, slots=True)
class StrandingSample:
    time: float
    # Free resources left after inflation, as % of the schedulable capacity.
    cpu_pct: float
    memory_pct: float
    # Free resources before inflation, for context.
    free_cpu_pct: float
    free_memory_pct: float
    # How many hourly samples this one stands for: a quiet spell of k samples
    # over an unchanged state is one sample of weight k (work and memory stay
    # bounded however long the spell).
    weight: int = 1


def inflate(
    free: FloatArray,
    shapes: FloatArray,
    weights: FloatArray,
    rng: np.random.Generator,
    *,
    max_rounds: int = 10_000,
) -> FloatArray:
    """Fill ``free`` (resources x hosts, a copy is made) with the mix until nothing fits.

    ``shapes`` is (shapes x resources), ``weights`` the relative frequency of
    each shape. Returns the free capacity left, same layout as ``free``.
    """
    left = np.array(free, dtype=np.float64, copy=True)
    if shapes.shape[0] == 0 or left.shape[1] == 0:
        return left
    seed = int(rng.integers(0, 2**63 - 1))
    _fill_hosts(
        left,
        np.ascontiguousarray(shapes, dtype=np.float64),
        np.ascontiguousarray(weights, dtype=np.float64),
        seed,
        max_rounds,
        FIT_TOLERANCE,
    )
    return left


# A request shape: one amount per resource.
_Shape = TypeVar("_Shape", bound=tuple[float, ...])


def most_common(counts: Mapping[_Shape, int], max_shapes: int) -> tuple[FloatArray, FloatArray]:
    """The ``max_shapes`` most common shapes of ``counts`` (shapes x resources) and their
    counts; empty arrays when ``counts`` is."""
    # Equal counts rank by shape (the smaller first), so the mix is the same
    # in every run. A sort: ``heapq.nlargest`` needs one key for both orders,
    # a negated shape built per item, five times the time here.
    common = sorted(counts.items(), key=_more_common_first)[:max_shapes]
    shapes = np.array([shape for shape, _ in common], dtype=np.float64)
    weights = np.array([count for _, count in common], dtype=np.float64)
    return shapes.reshape(-1, N_RESOURCES), weights


def _more_common_first(item: tuple[_Shape, int]) -> tuple[int, _Shape]:
    shape, count = item
    return -count, shape


@dataclass(frozen=True, slots=True)
class Inflated:
    """Per resource, summed over the hosts ``inflate_schedulable`` read."""

    left: FloatArray  # free after inflation
    before: FloatArray  # free before it
    capacity: FloatArray


def inflate_schedulable(
    cluster: ClusterState,
    shapes: FloatArray,
    weights: FloatArray,
    rng: np.random.Generator,
    *,
    in_use_only: bool = False,
) -> Inflated:
    """``inflate`` over ``cluster``'s schedulable hosts (those running a VM, with
    ``in_use_only``), summed per resource."""
    picked = cluster.schedulable[: cluster.n_hosts]
    if in_use_only:
        picked = picked & (cluster.vm_count[: cluster.n_hosts] > 0)
    hosts = np.flatnonzero(picked)
    free = cluster.free[:, hosts]
    return Inflated(
        left=inflate(free, shapes, weights, rng).sum(axis=1),
        before=free.sum(axis=1),
        capacity=cluster.capacity[:, hosts].sum(axis=1),
    )


def warm_up() -> None:
    """Compile (or load from numba's cache) the inflation kernel before the first event.

    The pools sample stranding hourly: left to the first sample, a fresh
    install's compile held the stream for about 0.4 s at that point. Both
    layouts: a pool's schedulable hosts, picked out of its arrays, come in
    Fortran order, which ``inflate``'s copy keeps.
    """
    for order in ("C", "F"):
        free = np.zeros((4, 2), order=order)
        inflate(free, np.ones((1, 4)), np.ones(1), np.random.default_rng(0))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@numba.njit(cache=True, nogil=True)
def _uniform(state: np.uint64) -> tuple[np.uint64, float]:
    """splitmix64 on unsigned 64-bit words: the next state and a draw in [0, 1)."""
    state = state + _GOLDEN
    z = state
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return state, float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@numba.njit(cache=True, nogil=True)
def _fill_hosts(
    left: FloatArray,
    shapes: FloatArray,
    weights: FloatArray,
    seed: int,
    max_rounds: int,
    tolerance: float,
) -> None:
    n_resources, n_hosts = left.shape
    n_shapes = shapes.shape[0]
    usable = np.empty(n_shapes)
    for h in range(n_hosts):
        # One stream per host, so hosts do not depend on each other's draws.
        state = np.uint64(seed) ^ (np.uint64(h + 1) * _GOLDEN)
        for _ in range(max_rounds):
            total = 0.0
            for s in range(n_shapes):
                fits = True
                for r in range(n_resources):
                    if left[r, h] < shapes[s, r] - tolerance:
                        fits = False
                        break
                usable[s] = weights[s] if fits else 0.0
                total += usable[s]
            if total == 0.0:
                break
            state, u = _uniform(state)
            target = u * total
            chosen = n_shapes - 1
            running = 0.0
            for s in range(n_shapes):
                running += usable[s]
                if usable[s] > 0.0 and running > target:
                    chosen = s
                    break
            fit_count = np.inf
            for r in range(n_resources):
                need = shapes[chosen, r]
                if need > 0.0:
                    fit_count = min(fit_count, np.floor(left[r, h] / need + tolerance))
            if fit_count == np.inf:
                break  # a shape that asks for nothing cannot exhaust a host
            copies = max(1.0, np.floor(fit_count / 2.0))
            for r in range(n_resources):
                left[r, h] -= shapes[chosen, r] * copies
