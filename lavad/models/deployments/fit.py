"""Population Gamma priors fitted on the first part of a trace (paper 002, appendix B).

Per deployment that *arrived* in the fitting window (older ones would bias the
fit towards long-lived deployments, as the paper notes) we estimate its rates by
maximum likelihood, then fit a Gamma to each rate across the population.

Choices that differ from the paper:

- Deployments that never scaled out (or never lost a core) have a zero MLE the
  Gamma cannot take. The paper calibrates two constants (epsilon) by a
  Cramer-von Mises search; we use the Jeffreys-style estimate
  ``(count + 1/2) / exposure`` for every deployment instead, which is positive
  and needs no calibration.
- The maximum lifetime rate gets the population MLE (kills / alive time) as
  the mean of a shape-1 Gamma (see ``process``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from lavad.models.deployments.process import DeploymentPriors, DeploymentState, GammaBelief

# A rate estimate from less exposure than this (seconds or core-seconds) is noise.
MIN_EXPOSURE = 1.0


@dataclass(frozen=True, slots=True)
class FitSample:
    """One deployment's history in the fitting window and whether it was shut down whole."""

    state: DeploymentState
    killed: bool


def fit_gamma(values: Sequence[float]) -> GammaBelief:
    """Gamma(shape, rate) fitted by maximum likelihood (location fixed at 0).

    Falls back to an exponential (shape 1) with the sample mean when there are
    fewer than two distinct positive values, where the MLE does not exist.
    """
    data = np.asarray([v for v in values if v > 0 and math.isfinite(v)], dtype=np.float64)
    if data.size == 0:
        raise ValueError("values must hold at least one positive finite number")
    if np.unique(data).size < 2:
        return GammaBelief(1.0, 1.0 / float(data.mean()))
    shape, _, scale = stats.gamma.fit(data, floc=0.0)
    return GammaBelief(float(shape), 1.0 / float(scale))


def fit_priors(samples: Sequence[FitSample]) -> DeploymentPriors:
    """Fit the four population priors from deployments observed in a fitting window."""
    if not samples:
        raise ValueError("samples must not be empty")
    death: list[float] = []
    scale: list[float] = []
    size: list[float] = []
    kills = 0.0
    alive = 0.0
    for sample in samples:
        state = sample.state
        if state.core_exposure >= MIN_EXPOSURE:
            death.append((state.core_deaths + 0.5) / state.core_exposure)
        if state.alive_time >= MIN_EXPOSURE:
            scale.append((state.scale_outs + 0.5) / state.alive_time)
        if state.scale_outs > 0:
            size.append((state.excess_size + 0.5) / state.scale_outs)
        kills += 1.0 if sample.killed else 0.0
        alive += state.alive_time
    if not death or not scale:
        raise ValueError("samples must include deployments with positive exposure")
    if not size:
        size = [0.5]
    kill_rate = (kills + 0.5) / max(alive, MIN_EXPOSURE)
    return DeploymentPriors(
        core_death=fit_gamma(death),
        scale_out=fit_gamma(scale),
        size=fit_gamma(size),
        kill=GammaBelief(1.0, 1.0 / kill_rate),
    )
