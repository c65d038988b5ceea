"""Admission policies on hand-worked cases, the registry, the replay and the tuner."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lavad.core.admission import (
    AdmissionConfigError,
    AdmissionPolicy,
    ClusterModel,
    FirstMoment,
    LookaheadGrid,
    SecondMoment,
    ZerothMoment,
    build_admission_policy,
    cantelli,
    validate_admission_args,
)
from lavad.evaluation.admission_replay import (
    EXIT,
    REQUEST,
    ReplayResult,
    VmEvent,
    replay,
    sort_events,
    tune_threshold,
)
from lavad.models.deployments import DeploymentPriors, GammaBelief


def _known(value: float) -> GammaBelief:
    """A belief so tight that the rate is ``value`` (shape 1e9)."""
    return GammaBelief(1e9, 1e9 / value)


# Core lifetimes of mean 1000 s, one scale-out of exactly one core every 20 s
# (excess size ~0), no kills: at t = 1000 s a deployment of N cores has
#   mean N e^-1 + 0.05 (1 - e^-1) / 0.001,  var N e^-1 (1 - e^-1) + 0.05 (1 - e^-1) / 0.001.
HAND = DeploymentPriors(
    core_death=_known(1e-3),
    scale_out=_known(0.05),
    size=GammaBelief(1.0, 1e12),
    kill=GammaBelief(1.0, 1e15),
)
GRID = LookaheadGrid((1000.0,), 1)
E1 = math.exp(-1.0)
NEW = 0.05 * (1 - E1) / 1e-3  # 31.606 cores from scale-outs, Poisson


def _cluster() -> ClusterModel:
    cluster = ClusterModel(HAND, GRID, capacity=100.0)
    cluster.add("a", now=0.0, cores=40.0)
    return cluster


def test_hand_case_moments() -> None:
    cluster = _cluster()
    mean, var = cluster.totals(0.0)
    assert float(mean[0]) == pytest.approx(40 * E1 + NEW, rel=1e-5)
    assert float(var[0]) == pytest.approx(40 * E1 * (1 - E1) + NEW, rel=1e-4)


def test_policy_ordering_on_hand_case() -> None:
    # With a 10-core candidate: active 50; expected 50 e^-1 + 2 x 31.606 = 81.61;
    # variance 50 e^-1 (1 - e^-1) + 2 x 31.606 = 74.84; Cantelli at capacity 100:
    # 74.84 / (74.84 + 18.39^2) = 0.181.
    mean = 50 * E1 + 2 * NEW
    var = 50 * E1 * (1 - E1) + 2 * NEW
    bound = var / (var + (100 - mean) ** 2)
    assert mean == pytest.approx(81.61, abs=0.01)
    assert bound == pytest.approx(0.181, abs=0.001)
    cluster = _cluster()

    def admits(policy: AdmissionPolicy) -> bool:
        return policy.decide(cluster, "b", 10.0, 0.0).admitted

    # The zeroth moment policy sees only 50 active cores and admits at 0.6;
    # the first moment policy sees 81.6 expected cores: rejects at 0.8, admits at 0.9;
    # the second moment policy rejects at 0.1 (bound 0.181) and admits at 0.2.
    assert admits(ZerothMoment(0.6))
    assert not admits(ZerothMoment(0.5))
    assert not admits(FirstMoment(0.8, GRID))
    assert admits(FirstMoment(0.9, GRID))
    assert not admits(SecondMoment(0.1, GRID))
    assert admits(SecondMoment(0.2, GRID))
    decision = SecondMoment(0.1, GRID).decide(cluster, "b", 10.0, 0.0)
    assert decision.failure_probability == pytest.approx(bound, rel=1e-3)
    assert decision.binding_horizon_s == 1000.0
    first = FirstMoment(0.8, GRID).decide(cluster, "b", 10.0, 0.0)
    assert first.failure_probability == pytest.approx(mean / 100, rel=1e-4)


def test_moment_policies_see_history_the_zeroth_does_not() -> None:
    # Same active cores in two clusters; in one the deployment keeps scaling
    # out, in the other it keeps shedding cores. Loose priors: history matters.
    priors = DeploymentPriors(
        core_death=GammaBelief(2.0, 2000.0),
        scale_out=GammaBelief(2.0, 200.0),
        size=GammaBelief(1.0, 1.0),
        kill=GammaBelief(1.0, 1e7),
    )
    grid = LookaheadGrid((3600.0, 600.0), 20)
    busy = ClusterModel(priors, grid, capacity=200.0)
    quiet = ClusterModel(priors, grid, capacity=200.0)
    busy.add("d", 0.0, 10.0)
    quiet.add("d", 0.0, 90.0)
    for k in range(40):
        busy.scale_out("d", 10.0 * (k + 1), 2.0)  # 10 -> 90 cores in 400 s
    for k in range(40):
        quiet.scale_in("d", 400.0 + k, 1.0)  # many deaths: short core lifetimes
        quiet.scale_out("d", 400.0 + k + 0.5, 1.0)  # ... replaced, active stays 90
    busy.refresh(440.0)
    quiet.refresh(440.0)
    assert busy.active_cores == quiet.active_cores == 90.0
    b_mean, _ = busy.totals(440.0)
    q_mean, _ = quiet.totals(440.0)
    assert b_mean.max() > q_mean.max()
    zeroth = ZerothMoment(0.9)
    assert zeroth.decide(busy, "c", 20.0, 440.0).admitted
    assert zeroth.decide(quiet, "c", 20.0, 440.0).admitted
    limit = 0.5 * (b_mean.max() + q_mean.max()) / 200.0
    first = FirstMoment(limit + 20.0 / 200.0, grid)
    assert not first.decide(busy, "c", 20.0, 440.0).admitted
    assert first.decide(quiet, "c", 20.0, 440.0).admitted


def test_marginal_heuristic_ignores_lookaheads_where_the_candidate_is_small() -> None:
    cluster = _cluster()
    strict = FirstMoment(0.8, GRID)
    # The candidate's expected cores at 1000 s are 10 e^-1 + 31.6 = 35.3 < 0.4 x 100.
    lenient = FirstMoment(0.8, GRID, marginal_fraction=0.4)
    assert not strict.decide(cluster, "b", 10.0, 0.0).admitted
    assert lenient.decide(cluster, "b", 10.0, 0.0).admitted


def test_cantelli_values() -> None:
    got = cantelli(np.array([50.0, 100.0, 120.0, 90.0]), np.array([100.0, 5.0, 5.0, 0.0]), 100.0)
    np.testing.assert_allclose(got, [100.0 / 2600.0, 1.0, 1.0, 0.0])


def test_registry_validates_arguments() -> None:
    policy = build_admission_policy("second", {"threshold": 0.01, "steps": 10})
    assert isinstance(policy, SecondMoment)
    assert policy.grid is not None and len(policy.grid.taus) == 50
    assert policy.grid.taus[0] == pytest.approx(3 * 365 * 86400 / 10)
    assert isinstance(build_admission_policy("zeroth"), ZerothMoment)
    custom = build_admission_policy("first", {"horizons_s": [3600, 60], "steps": 4})
    assert custom.grid is not None
    np.testing.assert_allclose(custom.grid.taus, [900, 1800, 2700, 3600, 15, 30, 45, 60])
    with pytest.raises(AdmissionConfigError, match=r"admission\.policy"):
        build_admission_policy("fourth")
    with pytest.raises(AdmissionConfigError, match=r"admission\.threshold") as bad:
        validate_admission_args("second", {"threshold": 1.5})
    assert bad.value.key == "admission.threshold"
    with pytest.raises(AdmissionConfigError, match="horizon"):
        validate_admission_args("first", {"horizon": 3})
    with pytest.raises(AdmissionConfigError, match="horizons_s"):
        validate_admission_args("first", {"horizons_s": [3600, -1]})


def _events() -> list[VmEvent]:
    return sort_events(
        [
            VmEvent(0.0, REQUEST, "A", "a1", 4.0),
            VmEvent(1.0, REQUEST, "B", "b1", 4.0),
            VmEvent(2.0, REQUEST, "A", "a2", 3.0),  # 11 > 10 if B is in: fails
            VmEvent(3.0, EXIT, "A", "a2", 3.0),  # ignored when a2 was refused
            VmEvent(4.0, EXIT, "A", "a1", 4.0),  # A reaches zero cores: dies
            VmEvent(5.0, REQUEST, "A", "a3", 2.0),  # ... so this is a new arrival
            VmEvent(6.0, EXIT, "B", "b1", 4.0),
            VmEvent(8.0, EXIT, "A", "a3", 2.0),
        ]
    )


def test_replay_counts_refused_scale_outs_by_hand() -> None:
    priors = HAND
    loose = replay(_events(), ZerothMoment(1.0), priors, 10.0, start=0.0, end=8.0)
    # B admitted (8 < 10); a2 refused; A dies at 4; A#1 arrives at 5 with 2 cores.
    assert (loose.arrivals, loose.admitted, loose.scale_outs, loose.failures) == (3, 3, 1, 1)
    # active: 4 on [0,1), 8 on [1,4), 4 on [4,5), 6 on [5,6), 2 on [6,8)
    # -> 4 + 24 + 4 + 6 + 4 = 42 core-s over 8 s of a 10-core cluster
    assert loose.utilisation == pytest.approx(42.0 / (10.0 * 8.0))
    assert loose.failure_rate == 1.0
    tight = replay(_events(), ZerothMoment(0.7), priors, 10.0, start=0.0, end=8.0)
    # B rejected (8 >= 7); a2 granted:
    # [0,1) 4, [1,2) 4, [2,3) 7, [3,4) 4, [4,5) 0, [5,8) 2  -> 4 + 4 + 7 + 4 + 0 + 6 = 25
    assert (tight.arrivals, tight.admitted, tight.scale_outs, tight.failures) == (3, 2, 1, 0)
    assert tight.utilisation == pytest.approx(25.0 / 80.0)


def test_replay_warm_up_grants_everything() -> None:
    result = replay(_events(), ZerothMoment(0.01), HAND, 10.0, start=2.5, end=8.0)
    # Before 2.5 all is granted (A 7 cores, B 4): no decisions or scale-outs counted after.
    assert (result.arrivals, result.scale_outs, result.failures) == (1, 0, 0)
    assert result.admitted == 0


def test_tuner_finds_the_largest_threshold_meeting_the_target() -> None:
    def run(threshold: float) -> ReplayResult:
        return ReplayResult("fake", threshold, 1.0, threshold, 100, round(100 * threshold**2), 0, 0)

    tuned = tune_threshold(run, 0.0, 1.0, 0.25, iterations=12)
    assert tuned.threshold == pytest.approx(0.5, abs=0.01)
    assert tuned.result.failure_rate <= 0.25
    logged = tune_threshold(run, 1e-4, 1.0, 0.25, iterations=20, log_scale=True)
    assert logged.threshold == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match="low"):
        tune_threshold(run, 1.0, 0.5, 0.1)
