"""Cluster admission control (paper 002): moment policies over online deployment models.

- ``cluster``: the admitted deployments' online models and cached moment sums.
- ``policies``: zeroth, first and second moment policies, the decision record.
- ``registry``: policy names and validated arguments from configuration.
- ``replay``: a trace replay with scale-out failures, and a threshold tuner.
"""

from lavad.daemon.admission.cluster import (
    PAPER_HORIZONS_S,
    PAPER_STEPS,
    ClusterModel,
    LookaheadGrid,
)
from lavad.daemon.admission.policies import (
    AdmissionDecision,
    AdmissionPolicy,
    FirstMoment,
    SecondMoment,
    ZerothMoment,
    cantelli,
)
from lavad.daemon.admission.registry import (
    ADMISSION_POLICIES,
    AdmissionConfigError,
    build_admission_policy,
    validate_admission_args,
)
from lavad.daemon.admission.replay import (
    EXIT,
    REQUEST,
    ReplayResult,
    TuneResult,
    VmEvent,
    latency_summary,
    replay,
    sort_events,
    tune_threshold,
)

__all__ = [
    "ADMISSION_POLICIES",
    "EXIT",
    "PAPER_HORIZONS_S",
    "PAPER_STEPS",
    "REQUEST",
    "AdmissionConfigError",
    "AdmissionDecision",
    "AdmissionPolicy",
    "ClusterModel",
    "FirstMoment",
    "LookaheadGrid",
    "ReplayResult",
    "SecondMoment",
    "TuneResult",
    "VmEvent",
    "ZerothMoment",
    "build_admission_policy",
    "cantelli",
    "latency_summary",
    "replay",
    "sort_events",
    "tune_threshold",
    "validate_admission_args",
]
