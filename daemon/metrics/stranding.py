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

* Hosts are filled independently (one vectorised draw per host per round)
  rather than one VM at a time through the placement policy: the terminal
  condition is the same, and the cost falls from O(VMs x hosts) to
  O(rounds x shapes x hosts), which keeps hourly sampling cheap on 10^4 hosts.
* A host takes half of the copies of the drawn shape that would fit (at least
  one), so hosts with room for thousands of tiny pods converge in a
  logarithmic number of rounds; the mix still decides what is left over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lavad.daemon.cluster import FIT_TOLERANCE, FloatArray


@dataclass(frozen=True, slots=True)
class StrandingSample:
    time: float
    # Free resources left after inflation, as % of the schedulable capacity.
    cpu_pct: float
    memory_pct: float
    # Free resources before inflation, for context.
    free_cpu_pct: float
    free_memory_pct: float


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
    n_shapes = shapes.shape[0]
    if n_shapes == 0 or left.shape[1] == 0:
        return left
    requested = [r for r in range(shapes.shape[1]) if np.any(shapes[:, r] > 0)]
    # Hosts still in the simulation; a host leaves once nothing fits it and
    # never comes back (it only loses capacity).
    hosts = np.arange(left.shape[1])
    for _ in range(max_rounds):
        fits = np.ones((n_shapes, len(hosts)), dtype=np.bool_)
        for r in requested:
            fits &= left[r, hosts][None, :] >= shapes[:, r][:, None] - FIT_TOLERANCE
        still = fits.any(axis=0)
        hosts = hosts[still]
        if len(hosts) == 0:
            break
        fits = fits[:, still]
        cumulative = np.cumsum(np.where(fits, weights[:, None], 0.0), axis=0)
        draw = rng.random(len(hosts)) * cumulative[-1]
        choice = np.minimum((cumulative <= draw[None, :]).sum(axis=0), n_shapes - 1)
        chosen = shapes[choice]  # (hosts, resources)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            room = np.where(chosen.T > 0, left[:, hosts] / chosen.T, np.inf)
        fit_count = np.floor(np.min(room, axis=0) + FIT_TOLERANCE)
        copies = np.maximum(1.0, np.floor(fit_count / 2.0))
        left[:, hosts] -= chosen.T * copies
    return left
