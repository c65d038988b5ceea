"""Per-job CPU and memory limits: Autopilot's recommenders and the Kubernetes VPA baseline.

- ``histogram``: bucket schemes, decayed counts, 5-minute per-job aggregation.
- ``window``: the moving-window recommenders (peak, average, load-adjusted percentiles).
- ``ml``: the ML recommender (ensemble of arg-min models, equations 4-9).
- ``vpa``: the Kubernetes VPA recommender with its defaults.
- ``decision``: limit decisions, emitted when a recommendation changes.
- ``horizontal``: replica counts from CPU utilisation (section 3.3).
"""

from lavad.models.limits.decision import LimitDecision, LimitTracker
from lavad.models.limits.histogram import (
    CPU_HALF_LIFE_S,
    MEMORY_HALF_LIFE_S,
    BucketScheme,
    DecayedCounts,
    JobAggregator,
    Observation,
    weighted_percentile,
)
from lavad.models.limits.horizontal import HorizontalConfig, HorizontalScaler
from lavad.models.limits.ml import MlConfig, MlRecommender, Model
from lavad.models.limits.vpa import VpaConfig, VpaHistogram, VpaRecommender
from lavad.models.limits.window import (
    LimitRecommender,
    MovingWindowRecommender,
    WindowConfig,
    default_statistic,
)

__all__ = [
    "CPU_HALF_LIFE_S",
    "MEMORY_HALF_LIFE_S",
    "BucketScheme",
    "DecayedCounts",
    "HorizontalConfig",
    "HorizontalScaler",
    "JobAggregator",
    "LimitDecision",
    "LimitRecommender",
    "LimitTracker",
    "MlConfig",
    "MlRecommender",
    "Model",
    "MovingWindowRecommender",
    "Observation",
    "VpaConfig",
    "VpaHistogram",
    "VpaRecommender",
    "WindowConfig",
    "default_statistic",
    "weighted_percentile",
]
