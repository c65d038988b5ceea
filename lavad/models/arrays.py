"""Array types shared by the models and the daemon, and how a model's per-row arrays grow.

Here, not in ``core/cluster.py``, so that the models depend on nothing of
the daemon: the daemon imports the models, never the other way round.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def grown(array: np.ndarray, size: int, fill: float = 0) -> np.ndarray:
    """``array`` with ``size`` rows (at least its own), the new ones ``fill``."""
    bigger = np.full((size, *array.shape[1:]), fill, dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger
