"""Algorithm 1 of Megha: the first host of a partition whose labels include the task's
constraints (the AND of the constraint bit vectors) and whose free resources cover its
demand. ``hosts scanned`` is what the cost model charges: the candidates looked at up
to the match (all of them when there is none)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lavad.federation.topology import IndexArray


def first_fit(
    free: npt.NDArray[np.int64],
    labels: npt.NDArray[np.uint64],
    candidates: IndexArray,
    demand: npt.NDArray[np.int64],
    constraints: int,
) -> tuple[int, int]:
    """``(host, hosts_scanned)``; host -1 when no candidate fits."""
    if candidates.size == 0:
        return -1, 0
    fits = np.all(free[candidates] >= demand, axis=1)
    if constraints:
        mask = np.uint64(constraints)
        fits &= (labels[candidates] & mask) == mask
    position = int(np.argmax(fits))
    if not fits[position]:
        return -1, int(candidates.size)
    return int(candidates[position]), position + 1
