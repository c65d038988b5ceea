"""Mean and variance of a deployment's future core count (Propositions 4.3, 4.5, appendix C).

For known parameters, with ``N`` cores now and look-ahead ``t``:

- the ``N`` current cores survive independently with ``q = exp(-mu t)``: ``Binomial(N, q)``;
- scale-outs are a Poisson stream (rate ``lam``) of batches ``B = 1 + Poisson(s)``; a
  core born at ``t - v`` is still alive at ``t`` with ``exp(-mu v)``. By Poisson
  marking, the alive new cores are a compound Poisson sum with
  ``E = lam E[B] I1`` and ``Var = lam (E[B] I1 + s (s + 2) I2)`` where
  ``I1 = int_0^t exp(-mu v) dv`` and ``I2 = int_0^t exp(-2 mu v) dv``;
- the whole count is multiplied by the maximum-lifetime indicator (``exp(-kill t)``).

Under the (independent) Gamma posteriors the exponentials become Laplace
transforms, ``E[exp(-c mu)] = (b / (b + c)) ** a``, and the time integrals of
them have closed forms (``_int_laplace`` and ``_int_r_laplace``). The second
moment is computed as ``E[X^2]`` under the joint posterior, so the variance
contains the parameter uncertainty (law of total variance), as in appendix C.

Difference from the paper: the paper folds death-at-zero-cores in through a
Jensen bound on its ``D`` variable. We leave it out: the formulas are exact for
the process in which a deployment at zero cores may still scale out, and an
upper bound on the mean of the process with death at zero (dying earlier only
removes cores), which errs on the safe side for admission.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

# Below this |w| the series of expm1(w) / w is used (its error there is ~w^2 / 6 < 1e-16).
_SMALL = 1e-8


def _phi(w: FloatArray) -> FloatArray:
    """expm1(w) / w, continuous at 0."""
    small = np.abs(w) < _SMALL
    safe = np.where(small, 1.0, w)
    return np.where(small, 1.0 + 0.5 * w, np.expm1(safe) / safe)


def laplace(shape: FloatArray, rate: FloatArray, c: FloatArray) -> FloatArray:
    """E[exp(-c X)] for X ~ Gamma(shape, rate)."""
    return np.exp(-shape * np.log1p(c / rate))


def _int_laplace(shape: FloatArray, rate: FloatArray, x: FloatArray) -> FloatArray:
    """int_0^x (1 + r / rate) ** -shape dr (stable at shape == 1)."""
    z = np.log1p(x / rate)
    return rate * z * _phi((1.0 - shape) * z)


def _int_r_laplace(shape: FloatArray, rate: FloatArray, x: FloatArray) -> FloatArray:
    """int_0^x r (1 + r / rate) ** -shape dr (stable at shape == 1 and 2)."""
    z = np.log1p(x / rate)
    return rate * rate * z * (_phi((2.0 - shape) * z) - _phi((1.0 - shape) * z))


def core_count_moments(
    cores: FloatArray,
    death: tuple[FloatArray, FloatArray],
    scale_out: tuple[FloatArray, FloatArray],
    size: tuple[FloatArray, FloatArray],
    kill: tuple[FloatArray, FloatArray],
    taus: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Mean and variance of core counts, shape ``(deployments, len(taus))``.

    Each belief is a ``(shape, rate)`` pair of arrays over deployments; ``taus``
    are look-ahead times (seconds from now, >= 0).
    """
    n = np.asarray(cores, dtype=np.float64)[:, None]
    a_mu, b_mu = (np.asarray(v, dtype=np.float64)[:, None] for v in death)
    a_l, b_l = (np.asarray(v, dtype=np.float64)[:, None] for v in scale_out)
    a_s, b_s = (np.asarray(v, dtype=np.float64)[:, None] for v in size)
    a_k, b_k = (np.asarray(v, dtype=np.float64)[:, None] for v in kill)
    t = np.asarray(taus, dtype=np.float64)[None, :]
    if np.any(t < 0):
        raise ValueError("taus must be >= 0")

    lam1 = a_l / b_l
    lam2 = a_l * (a_l + 1.0) / (b_l * b_l)
    s1 = a_s / b_s
    s2 = a_s * (a_s + 1.0) / (b_s * b_s)
    batch1 = 1.0 + s1  # E[B]
    batch2 = 1.0 + 2.0 * s1 + s2  # E[B^2]
    excess2 = s2 + 2.0 * s1  # E[s (s + 2)]

    alive = laplace(a_k, b_k, t)  # P(maximum lifetime > t)
    q1 = laplace(a_mu, b_mu, t)  # E[exp(-mu t)]
    q2 = laplace(a_mu, b_mu, 2.0 * t)  # E[exp(-2 mu t)]
    f_t = _int_laplace(a_mu, b_mu, t)
    f_2t = _int_laplace(a_mu, b_mu, 2.0 * t)
    j1 = f_t  # E[I1]
    j2 = 0.5 * f_2t  # E[I2]
    j3 = f_2t - f_t  # E[exp(-mu t) I1]
    g_t = _int_r_laplace(a_mu, b_mu, t)
    g_2t = _int_r_laplace(a_mu, b_mu, 2.0 * t)
    # E[I1^2] = int_0^2t L(r) min(r, 2t - r) dr, split at r = t.
    j4 = 2.0 * g_t - g_2t + 2.0 * t * (f_2t - f_t)

    mean_z = n * q1 + lam1 * batch1 * j1
    second_z = (
        n * (q1 - q2)
        + n * n * q2
        + lam1 * (batch1 * j1 + excess2 * j2)
        + 2.0 * n * lam1 * batch1 * j3
        + lam2 * batch2 * j4
    )
    mean = alive * mean_z
    var = alive * second_z - mean * mean
    return mean, np.maximum(var, 0.0)
