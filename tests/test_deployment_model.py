"""Deployment scaling model: conjugate posterior updates and the moment formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from lavad.models.deployments import (
    DeploymentParams,
    DeploymentPriors,
    DeploymentState,
    GammaBelief,
    core_count_moments,
    sample_params,
    simulate_core_counts,
)
from lavad.models.deployments.fit import FitSample, fit_gamma, fit_priors
from lavad.models.deployments.moments import _int_laplace, _int_r_laplace

PRIORS = DeploymentPriors(
    core_death=GammaBelief(2.0, 100.0),
    scale_out=GammaBelief(1.0, 50.0),
    size=GammaBelief(2.0, 4.0),
    kill=GammaBelief(1.0, 1000.0),
)


def test_posterior_matches_hand_computation() -> None:
    state = DeploymentState.arrive("d", now=0.0, cores=3.0)
    state.scale_out(10.0, 2.0)  # 3 cores for 10 s
    state.scale_in(30.0, 1.0)  # 5 cores for 20 s
    state.advance(50.0)  # 4 cores for 20 s
    post = state.posterior(PRIORS)
    # core-seconds 3*10 + 5*20 + 4*20 = 210, one core death
    assert post.core_death == GammaBelief(2.0 + 1.0, 100.0 + 210.0)
    # one scale-out in 50 s alive
    assert post.scale_out == GammaBelief(1.0 + 1.0, 50.0 + 50.0)
    # its size 2 = 1 + an excess of 1, over one scale-out
    assert post.size == GammaBelief(2.0 + 1.0, 4.0 + 1.0)
    # still alive after 50 s: exposure only
    assert post.kill == GammaBelief(1.0, 1000.0 + 50.0)
    assert post.core_death.mean == pytest.approx(3.0 / 310.0)


def test_state_rejects_bad_arguments() -> None:
    state = DeploymentState.arrive("d", now=5.0, cores=1.0)
    with pytest.raises(ValueError, match="precedes"):
        state.advance(4.0)
    with pytest.raises(ValueError, match="cores"):
        state.scale_out(6.0, 0.5)
    with pytest.raises(ValueError, match="cores"):
        DeploymentState.arrive("e", now=0.0, cores=0.0)
    with pytest.raises(ValueError, match="shape"):
        GammaBelief(0.0, 1.0)
    with pytest.raises(ValueError, match="rate"):
        GammaBelief(1.0, math.inf)


def test_fit_priors_uses_jeffreys_rates_and_pooled_kill_rate() -> None:
    a = DeploymentState.arrive("a", 0.0, 2.0)
    a.scale_out(10.0, 3.0)
    a.scale_in(20.0, 5.0)  # 2*10 + 5*10 = 70 core-s, 5 deaths; 1 scale-out in 20 s
    b = DeploymentState.arrive("b", 0.0, 1.0)
    b.advance(40.0)  # 40 core-s, no deaths, no scale-outs in 40 s
    priors = fit_priors([FitSample(a, killed=True), FitSample(b, killed=False)])
    # kills 1 over 60 s alive: (1 + 1/2) / 60, the mean of a shape-1 Gamma
    assert priors.kill.shape == 1.0
    assert priors.kill.mean == pytest.approx(1.5 / 60.0)
    # one deployment with a scale-out, excess 2: one size sample (2 + 1/2) / 1 -> exponential
    assert priors.size.mean == pytest.approx(2.5)
    with pytest.raises(ValueError, match="samples"):
        fit_priors([])


def test_fit_gamma_recovers_parameters() -> None:
    rng = np.random.default_rng(7)
    draws = rng.gamma(3.0, 1.0 / 40.0, size=4000)
    belief = fit_gamma(draws.tolist())
    assert belief.shape == pytest.approx(3.0, rel=0.08)
    assert belief.rate == pytest.approx(40.0, rel=0.08)


@pytest.mark.parametrize("shape", [0.3, 1.0, 1.0 + 1e-10, 2.0, 5.5])
def test_closed_form_integrals_match_quadrature(shape: float) -> None:
    rate, x = 700.0, 2500.0
    want1, _ = integrate.quad(lambda r: (1 + r / rate) ** -shape, 0, x)
    want2, _ = integrate.quad(lambda r: r * (1 + r / rate) ** -shape, 0, x)
    a, b, xs = np.array([shape]), np.array([rate]), np.array([x])
    assert float(_int_laplace(a, b, xs)[0]) == pytest.approx(want1, rel=1e-9)
    assert float(_int_r_laplace(a, b, xs)[0]) == pytest.approx(want2, rel=1e-7)


def _known(value: float) -> tuple[np.ndarray, np.ndarray]:
    """A Gamma belief so tight it is the value itself."""
    return np.array([1e9]), np.array([1e9 / value])


def test_moments_with_known_parameters_match_hand_formula() -> None:
    # N = 4, mu = 0.1, lam = 0.5, s = 1, no kill, t = 10:
    # mean = 4 e^-1 + lam (1 + s) (1 - e^-1) / mu
    # var  = 4 e^-1 (1 - e^-1) + lam ((1 + s)(1 - e^-1)/mu + s (s + 2)(1 - e^-2)/(2 mu))
    mean, var = core_count_moments(
        np.array([4.0]),
        _known(0.1),
        _known(0.5),
        _known(1.0),
        _known(1e-12),
        np.array([10.0]),
    )
    e1, e2 = math.exp(-1.0), math.exp(-2.0)
    want_mean = 4 * e1 + 0.5 * 2 * (1 - e1) / 0.1
    want_var = 4 * e1 * (1 - e1) + 0.5 * (2 * (1 - e1) / 0.1 + 3 * (1 - e2) / 0.2)
    assert float(mean[0, 0]) == pytest.approx(want_mean, rel=1e-6)
    assert float(var[0, 0]) == pytest.approx(want_var, rel=1e-5)


MC_PRIORS = DeploymentPriors(
    core_death=GammaBelief(3.0, 3000.0),
    scale_out=GammaBelief(4.0, 2000.0),
    size=GammaBelief(2.0, 1.0),
    kill=GammaBelief(2.0, 20000.0),
)
MC_TAUS = np.array([0.0, 500.0, 1500.0, 4000.0, 12000.0])


def _monte_carlo(die_at_zero: bool, runs: int, seed: int) -> np.ndarray:
    """Paths of the same process: parameters from the beliefs, then the exact event process."""
    rng = np.random.default_rng(seed)
    return np.array(
        [
            simulate_core_counts(
                sample_params(MC_PRIORS, rng), 5, MC_TAUS, rng, die_at_zero=die_at_zero
            )
            for _ in range(runs)
        ]
    )


def _formula() -> tuple[np.ndarray, np.ndarray]:
    p = MC_PRIORS

    def pair(b: GammaBelief) -> tuple[np.ndarray, np.ndarray]:
        return np.array([b.shape]), np.array([b.rate])

    mean, var = core_count_moments(
        np.array([5.0]), pair(p.core_death), pair(p.scale_out), pair(p.size), pair(p.kill), MC_TAUS
    )
    return mean[0], var[0]


def test_moments_match_monte_carlo_within_sampling_error() -> None:
    runs = 6000
    paths = _monte_carlo(die_at_zero=False, runs=runs, seed=11)
    mean, var = _formula()
    sample_mean = paths.mean(axis=0)
    sample_var = paths.var(axis=0, ddof=1)
    centred = paths - sample_mean
    # standard errors: of the mean sqrt(var/n), of the variance sqrt((m4 - var^2)/n)
    se_mean = np.sqrt(sample_var / runs)
    se_var = np.sqrt(np.maximum((centred**4).mean(axis=0) - sample_var**2, 0.0) / runs)
    assert sample_mean[0] == 5.0 and mean[0] == pytest.approx(5.0)
    assert np.all(np.abs(sample_mean[1:] - mean[1:]) <= 4.0 * se_mean[1:])
    assert np.all(np.abs(sample_var[1:] - var[1:]) <= 4.0 * se_var[1:])
    # the look-ahead profile is not flat, so the comparison has teeth
    assert mean.max() - mean.min() > 10 * se_mean.max()


def test_mean_bounds_the_process_with_death_at_zero() -> None:
    runs = 6000
    paths = _monte_carlo(die_at_zero=True, runs=runs, seed=12)
    mean, _ = _formula()
    sample_mean = paths.mean(axis=0)
    se_mean = np.sqrt(paths.var(axis=0, ddof=1) / runs)
    assert np.all(sample_mean <= mean + 4.0 * se_mean)


def test_simulator_kills_at_maximum_lifetime() -> None:
    params = DeploymentParams(
        core_death_rate=1e-9, scale_out_rate=0.0, size_mean_excess=0.0, kill_rate=1e3
    )
    path = simulate_core_counts(
        params, 3, np.array([0.0, 1.0]), np.random.default_rng(0), die_at_zero=False
    )
    assert path[0] == 3.0 and path[1] == 0.0
