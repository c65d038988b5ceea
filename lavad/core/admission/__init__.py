"""Cluster admission control (paper 002): moment policies over online deployment models.

- ``cluster``: the admitted deployments' online models and cached moment sums.
- ``policies``: zeroth, first and second moment policies, the decision record.
- ``registry``: policy names and validated arguments from configuration.
"""

from lavad.core.admission.cluster import (
    PAPER_HORIZONS_S,
    PAPER_STEPS,
    ClusterModel,
    LookaheadGrid,
)
from lavad.core.admission.policies import (
    AdmissionDecision,
    AdmissionPolicy,
    FirstMoment,
    SecondMoment,
    ZerothMoment,
    cantelli,
)
from lavad.core.admission.registry import (
    ADMISSION_POLICIES,
    AdmissionConfigError,
    build_admission_policy,
    validate_admission_args,
)

__all__ = [
    "ADMISSION_POLICIES",
    "PAPER_HORIZONS_S",
    "PAPER_STEPS",
    "AdmissionConfigError",
    "AdmissionDecision",
    "AdmissionPolicy",
    "ClusterModel",
    "FirstMoment",
    "LookaheadGrid",
    "SecondMoment",
    "ZerothMoment",
    "build_admission_policy",
    "cantelli",
    "validate_admission_args",
]
