"""Array types shared by the models and the daemon.

Here, not in ``core/cluster.py``, so that the models depend on nothing of
the daemon: the daemon imports the models, never the other way round.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
