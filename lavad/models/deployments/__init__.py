"""Deployment scaling models for admission control (paper 002: sections 2.1, 4, appendices B-C).

- ``process``: the scaling process, Gamma beliefs, online conjugate state, a simulator.
- ``fit``: population Gamma priors from the first part of a trace (offline: import it
  as ``lavad.models.deployments.fit``; it loads scipy.stats, a second of start-up the
  daemon, which never fits priors, does not pay).
- ``moments``: mean and variance of a deployment's future core count.
"""

from lavad.models.deployments.moments import core_count_moments, laplace
from lavad.models.deployments.process import (
    DeploymentParams,
    DeploymentPriors,
    DeploymentState,
    GammaBelief,
    sample_params,
    simulate_core_counts,
)

__all__ = [
    "DeploymentParams",
    "DeploymentPriors",
    "DeploymentState",
    "GammaBelief",
    "core_count_moments",
    "laplace",
    "sample_params",
    "simulate_core_counts",
]
