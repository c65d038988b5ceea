"""Log-spaced lifetime bins: the support of every lifetime distribution.

Lifetimes span seconds to months and matter on a log scale (LAVA's classes
are decades: <1 h, 1-10 h, ...), so bins are log-spaced between ``first_s``
and ``horizon_s``; the first bin is [0, first_s) and a last open bin holds
the mass beyond the horizon.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lavad.models.arrays import FloatArray


@dataclass(frozen=True, slots=True)
class LifetimeBins:
    # edges[0] = 0 < edges[1] = first_s < ... < edges[-1] = horizon_s
    edges: FloatArray
    # A representative lifetime per bin (len(edges) - 1 bins) plus one for
    # the open bin beyond the horizon.
    representative: FloatArray

    @classmethod
    def log_spaced(
        cls, first_s: float = 300.0, horizon_s: float = 90 * 86_400.0, count: int = 40
    ) -> LifetimeBins:
        if not 0 < first_s < horizon_s:
            raise ValueError(f"need 0 < first_s < horizon_s, got {first_s}, {horizon_s}")
        if count < 2:
            raise ValueError(f"need at least 2 bins, got {count}")
        inner = np.geomspace(first_s, horizon_s, count)
        edges = np.concatenate(([0.0], inner))
        middle = np.sqrt(edges[1:-1] * edges[2:])
        representative = np.concatenate(([first_s / 2.0], middle, [2.0 * horizon_s]))
        return cls(edges, representative)

    @property
    def pareto_tail_hazard(self) -> FloatArray:
        """Per bin, the hazard of a Pareto tail with index 1: S(t) ~ 1 / t.

        S(e_{j+1}) / S(e_j) = e_j / e_{j+1}, so hazard_j = 1 - e_j / e_{j+1}:
        the "it lives about as long again" rule (Lindy) that the heavy tails
        of VM lifetimes follow, used where a group has no data yet.
        """
        edges = self.edges
        inner = 1.0 - edges[:-1] / edges[1:]
        hazard: FloatArray = np.concatenate([inner, [0.0]])
        return hazard

    @property
    def count(self) -> int:
        """Bins including the open one beyond the horizon."""
        return len(self.edges)

    def index(self, lifetimes: FloatArray) -> np.ndarray:
        """The bin of each lifetime (the open bin for lifetimes at or past the horizon)."""
        return np.searchsorted(self.edges, lifetimes, side="right") - 1
