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
    shape = (size, *array.shape[1:])
    # Zeros come from the allocator as untouched pages, written when a row
    # is first used: a model's tables double to tens of megabytes, and
    # filling them ahead would be most of the time spent growing them.
    bigger = np.zeros(shape, dtype=array.dtype) if fill == 0 else np.full(shape, fill, array.dtype)
    bigger[: len(array)] = array
    return bigger
