"""The upper percentile of a host's usage sum, beyond the normal approximation.

GPA (Janus and Rzadca) takes a host's total usage as N(sum mu, sum sigma^2)
and its (1 - rho) percentile as mu + z sigma, z = Phi^-1(1 - rho). That
holds when a host sums many VMs; with few VMs of skewed, bursty usage the
sum is skewed too, and the normal percentile sits below the real one.

Independent VMs' cumulants add, so a host keeps the sums k2, k3, k4 of its
VMs' second, third and fourth cumulants in O(1) as it keeps mu and sigma^2,
and the Cornish-Fisher expansion corrects z by the sum's skewness
g = k3 / k2^1.5 and excess kurtosis e = k4 / k2^2:

    z_cf = z + (z^2 - 1) g / 6 + (z^3 - 3 z) e / 24 - (2 z^3 - 5 z) g^2 / 36

The expansion is an asymptotic series: far from normal it can bend back
(large g makes the g^2 term win). Where it does not rise with z it is no
quantile function, and the skewness term alone is used. z_cf is kept in
[0, sqrt((1 - rho) / rho)]: at least the mean (rare spikes, a high
kurtosis, can put the percentile there, rightly), and at most Cantelli's
one-sided bound, which holds for every distribution with that mean and
variance, so no correction goes past what any tail could need. What the
expansion still gets wrong (drift, covariance) is the online margin's job
(``margin.py``).

A percentile method is a name; ``TAIL_METHODS`` lists those a pool's
margin is learned on and chosen among. Each gives a host's predicted excess
over its mean sum, ``excess = z_method * sigma``, which the margin scales.
``CANTELLI`` (``z = sqrt((1 - rho) / rho)``) is the fallback a pool uses
while its scores are too few for any learned margin to be a finite-sample
bound (``margin.py``): it needs no scores, only the mean and variance.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from lavad.models.arrays import FloatArray

NORMAL: Final = "normal"
CORNISH_FISHER: Final = "cornish-fisher"
CANTELLI: Final = "cantelli"
TAIL_METHODS: Final = (NORMAL, CORNISH_FISHER)
# Every method a host's percentile can be read through: the learned ones and the fallback.
PERCENTILE_METHODS: Final = (*TAIL_METHODS, CANTELLI)


def cantelli_factor(rho: float) -> float:
    """sqrt((1 - rho) / rho): P(X > mu + k sigma) <= rho for any X (Cantelli's inequality)."""
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho!r}")
    return math.sqrt((1.0 - rho) / rho)


def cornish_fisher_factor(
    z: float,
    rho: float,
    second: FloatArray | float,
    third: FloatArray | float,
    fourth: FloatArray | float,
) -> FloatArray:
    """z corrected by the skewness and excess kurtosis of sums with these cumulant sums.

    ``z`` is Phi^-1(1 - rho); where the second cumulant is 0 (no spread)
    the normal z is returned. Elementwise over arrays of hosts.
    """
    k2 = np.asarray(second, dtype=np.float64)
    k3 = np.asarray(third, dtype=np.float64)
    k4 = np.asarray(fourth, dtype=np.float64)
    spread = k2 > 0.0
    safe = np.where(spread, k2, 1.0)
    skew = np.where(spread, k3 / safe**1.5, 0.0)
    kurtosis = np.where(spread, k4 / (safe * safe), 0.0)
    first = z + (z * z - 1.0) * skew / 6.0
    corrected = (
        first + (z**3 - 3.0 * z) * kurtosis / 24.0 - (2.0 * z**3 - 5.0 * z) * skew * skew / 36.0
    )
    # The expansion is a quantile function only where it rises with z; past
    # that (a skewness whose square term wins) the skewness term alone.
    slope = (
        1.0
        + z * skew / 3.0
        + (3.0 * z * z - 3.0) * kurtosis / 24.0
        - (6.0 * z * z - 5.0) * skew * skew / 36.0
    )
    chosen = np.where(slope > 0.0, corrected, first)
    clipped: FloatArray = np.clip(chosen, 0.0, cantelli_factor(rho))
    return clipped


def tail_factor(
    method: str,
    z: float,
    rho: float,
    second: FloatArray | float,
    third: FloatArray | float,
    fourth: FloatArray | float,
) -> FloatArray:
    """Per host: how many standard deviations the (1 - rho) percentile sits above the mean."""
    if method == NORMAL:
        return np.full(np.shape(second), z, dtype=np.float64)
    if method == CORNISH_FISHER:
        return cornish_fisher_factor(z, rho, second, third, fourth)
    if method == CANTELLI:
        return np.full(np.shape(second), cantelli_factor(rho), dtype=np.float64)
    known = ", ".join(PERCENTILE_METHODS)
    raise ValueError(f"unknown tail method {method!r}; known: {known}")


def effective_variance(
    method: str,
    z: float,
    rho: float,
    margin: float,
    second: FloatArray,
    third: FloatArray,
    fourth: FloatArray,
) -> FloatArray:
    """The variance whose normal percentile is the method's, margin included: (m z_k / z)^2 k2.

    GPA's fit test, score and overflow probability all read a host's
    variance; handing them this one makes every reader agree with the
    method: mu + z sqrt(effective) = mu + m z_k sigma.
    """
    factor = tail_factor(method, z, rho, second, third, fourth)
    scale = margin * factor / z
    scaled: FloatArray = np.maximum(second, 0.0) * scale * scale
    return scaled
