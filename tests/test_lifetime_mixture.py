"""The mixture of life tables at several memories: its weight update by hand, and what it reads."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from test_lifetime_no_oracle_leak import _replay

from lavad.core.placement.lifetime import LIFETIME_MODELS, LifetimeSettings
from lavad.daemon.live import state_codec
from lavad.evaluation.lifetime import evaluate_lifetime_model
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.features import DECLARED_CATEGORICAL, LEVELS
from lavad.models.lifetime.mixture import MixtureLifeTables, fixed_share_update
from lavad.models.lifetime.protocol import RunningVMs
from lavad.streams.schema import Event, VmExit, VmRequest

KEYS = (("t", "1c"), ("1c", 0, 1), ("1c",), ("all",), ())


def _small_bins() -> LifetimeBins:
    # edges 0, 100, 1000, 10000 s and the open bin
    return LifetimeBins.log_spaced(first_s=100.0, horizon_s=10_000.0, count=3)


def test_fixed_share_update_by_hand() -> None:
    # Two members, one band, equal weights. Member 0 gave the outcomes
    # probability 0.8 in all, member 1 0.2: Bayes gives 0.8 / (0.8 + 0.2) =
    # 0.8 and 0.2; a fixed share of 0.1 spreads 0.05 to each:
    # 0.9 * 0.8 + 0.05 = 0.77, 0.9 * 0.2 + 0.05 = 0.23.
    log_weight = np.log(np.array([[0.5, 0.5]]))
    scores = np.log(np.array([[0.8, 0.2]]))
    updated = np.exp(fixed_share_update(log_weight, scores, 0.1))
    assert updated.tolist() == [[pytest.approx(0.77), pytest.approx(0.23)]]
    # Bands are updated each on their own: a band with no outcome keeps its weights.
    two = fixed_share_update(np.log(np.full((2, 2), 0.5)), np.array([[0.0, -1.0], [0.0, 0.0]]), 0.0)
    # band 0: e^0 / (e^0 + e^-1) = 1 / (1 + 1/e)
    assert np.exp(two[0, 0]) == pytest.approx(1.0 / (1.0 + math.exp(-1.0)))
    assert np.exp(two[1]).tolist() == [pytest.approx(0.5), pytest.approx(0.5)]


def test_a_mixture_weight_update_by_hand() -> None:
    model = MixtureLifeTables(
        _small_bins(),
        min_observations=1,
        half_lives_s=(None, 1000.0),
        band_edges_s=(),
        fixed_share=0.0,
        per_owner=False,
    )
    rows = model.rows_for(KEYS)
    # VM 1 created at 0 lives 50 s; VM 2 created at 1000 lives 500 s.
    model.observe_exit(rows, 50.0, now=50.0)
    model.observe_exit(rows, 500.0, now=1500.0)
    # The first refit scores nothing (no tables before it) and fits both members.
    model.refit(RunningVMs(np.zeros((0, LEVELS), dtype=np.int64), np.zeros(0)), now=2000.0)
    assert np.exp(model.log_weight).tolist() == [[0.5, 0.5]]
    # Member 0 (no forgetting): one death in [0, 100) of 2 at risk, then the
    # other in [100, 1000): S(100) = 1/2, S(1000) = 0. Member 1 (half-life
    # 1000 s, weights by creation at 2000: VM 1 2^-2 = 1/4, VM 2 2^-1 = 1/2):
    # S(100) = 1 - (1/4) / (3/4) = 2/3, S(1000) = 0.
    assert model.members[0].m0[rows[0], 1] == pytest.approx(0.5)
    assert model.members[1].m0[rows[0], 1] == pytest.approx(2 / 3)
    # Until 3000: VM 3, created at 2000, exits at 2080; VM 4, created at
    # 2500, runs (uptime 500 at 3000). VM 3 died in (0, 1000]: both members
    # said P = 1 - S(1000) = 1 (log 0). VM 4 lived past 500 from 0: mass is
    # uniform inside [100, 1000), so S(500) = S(100) (1 - 400/900):
    # member 0: 1/2 * 5/9 = 5/18; member 1: 2/3 * 5/9 = 10/27.
    # Weights: 5/18 : 10/27 = 15 : 20, i.e. 3/7 and 4/7.
    model.observe_exit(rows, 80.0, now=2080.0)
    running = np.array([rows], dtype=np.int64)
    model.refit(RunningVMs(running, np.array([500.0])), now=3000.0)
    weight = model.weights()
    assert weight.tolist() == [[pytest.approx(3 / 7), pytest.approx(4 / 7)]]
    # The prediction mixes the members' survival through each bin with
    # those weights: r[j] = 3/7 r_0[j] + 4/7 r_1[j], S(e_j+1) = S(e_j) r[j].
    combo = model.choose(rows)
    s0 = model.members[0].m0[model.members[0].choose(rows)]
    s1 = model.members[1].m0[model.members[1].choose(rows)]
    survival = 1.0
    for j in range(3):
        through = [s[j + 1] / s[j] if s[j] > 0 else 0.0 for s in (s0, s1)]
        survival *= 3 / 7 * through[0] + 4 / 7 * through[1]
        assert model.m0[combo, j + 1] == pytest.approx(survival)


def test_owner_weights_by_hand() -> None:
    model = MixtureLifeTables(
        _small_bins(),
        min_observations=1,
        half_lives_s=(None, 1000.0),
        band_edges_s=(),
        fixed_share=0.0,
        per_owner=False,
    )
    rows_a = model.rows_for(KEYS)
    rows_b = model.rows_for((("u", "1c"), *KEYS[1:]))
    rows_c = model.rows_for((("w", "1c"), *KEYS[1:]))
    # As in the hand-worked update above: tables fitted at 2000 from owner
    # a's VMs 1 and 2, then at 3000 owner a has a VM running at uptime 500
    # and so has owner b. Owner b has no data of its own and backs off to
    # the shape group, which holds the same two VMs: the same P(T > 500),
    # 5/18 for member 0 and 10/27 for member 1.
    model.observe_exit(rows_a, 50.0, now=50.0)
    model.observe_exit(rows_a, 500.0, now=1500.0)
    model.refit(RunningVMs(np.zeros((0, LEVELS), dtype=np.int64), np.zeros(0)), now=2000.0)
    model.refit(RunningVMs(np.array([rows_a, rows_b]), np.array([500.0, 500.0])), now=3000.0)
    # The pool scores both VMs: (5/18)^2 : (10/27)^2 = 9 : 16.
    assert model.weights().tolist() == [[pytest.approx(9 / 25), pytest.approx(16 / 25)]]
    # Each owner starts from the pool's weights before the update (1/2 each)
    # and scores its own VM: 5/18 : 10/27 = 3 : 4.
    for owner in (rows_a[0], rows_b[0]):
        owner_weight = np.exp(model.owner_log_weight[owner]).tolist()
        assert owner_weight == [[pytest.approx(3 / 7), pytest.approx(4 / 7)]]
    # Owner c had no outcome: its VMs are predicted with the pool's weights.
    assert not model.owner_scored[rows_c[0]]
    a, c = model.choose(rows_a), model.choose(rows_c)
    member_0 = model.members[0].m0[model.members[0].choose(rows_a)]
    member_1 = model.members[1].m0[model.members[1].choose(rows_a)]
    # P(T > 100) mixed: w0 S_0(100) + w1 S_1(100), after the first bin.
    assert model.m0[a, 1] == pytest.approx(3 / 7 * member_0[1] + 4 / 7 * member_1[1])
    member_0 = model.members[0].m0[model.members[0].choose(rows_c)]
    member_1 = model.members[1].m0[model.members[1].choose(rows_c)]
    assert model.m0[c, 1] == pytest.approx(9 / 25 * member_0[1] + 16 / 25 * member_1[1])


def test_one_member_with_all_the_weight_predicts_as_that_member() -> None:
    model = MixtureLifeTables(_small_bins(), min_observations=1, half_lives_s=(None, 500.0))
    rows = model.rows_for(KEYS)
    for k, lifetime in enumerate((50.0, 150.0, 400.0, 2000.0, 30.0)):
        model.observe_exit(rows, lifetime, now=300.0 * k + lifetime)
    model.refit(RunningVMs(np.zeros((0, LEVELS), dtype=np.int64), np.zeros(0)), now=5000.0)
    for member in (0, 1):
        log_weight = np.full_like(model.log_weight, -1e9)
        log_weight[:, member] = 0.0
        model.log_weight = log_weight
        model._new_epoch()  # the combos' tables are recomputed from the new weights
        own = model.members[member]
        np.testing.assert_allclose(
            model.mass[model.choose(rows)], own.mass[own.choose(rows)], atol=1e-12
        )


def _drifting_events(seed: int) -> list[Event]:
    """VMs every 5 minutes for 12 days: lifetimes ~ 10 h, then ~ 10 min from day 8."""
    rng = np.random.default_rng(seed)
    events: list[tuple[float, int, Event]] = []
    for i in range(12 * 288):
        start = 300.0 * i
        scale = 36_000.0 if start < 8 * 86_400.0 else 600.0
        lifetime = float(rng.exponential(scale)) + 30.0
        vm = f"v{i}"
        events.append(
            (start, 0, VmRequest(time=start, pool="p", vm_id=vm, cores=1.0, memory_gib=2.0))
        )
        events.append((start + lifetime, 1, VmExit(time=start + lifetime, pool="p", vm_id=vm)))
    events.sort(key=lambda item: (item[0], item[1]))
    return [event for _, _, event in events]


def test_after_a_swing_the_short_memories_take_the_young_band() -> None:
    model = MixtureLifeTables(LifetimeBins.log_spaced())
    running: dict[str, tuple[tuple[int, ...], float]] = {}
    next_refit = 0.0
    weights_before_swing = None
    for event in _drifting_events(5):
        if event.time >= next_refit:
            if weights_before_swing is None and event.time >= 8 * 86_400.0:
                weights_before_swing = model.weights()
            rows = np.array([r for r, _ in running.values()], dtype=np.int64).reshape(-1, LEVELS)
            uptimes = np.array([event.time - s for _, s in running.values()])
            model.refit(RunningVMs(rows, uptimes), now=event.time)
            next_refit = event.time + 3600.0
        if isinstance(event, VmRequest):
            keys = (("", "1c2g"), ("1c2g", None, None), ("1c2g",), ("all",), ())
            running[event.vm_id] = (model.rows_for(keys), event.time)
        elif isinstance(event, VmExit):
            rows_then, start = running.pop(event.vm_id)
            model.observe_exit(rows_then, event.time - start, event.time)
    assert weights_before_swing is not None
    after = model.weights()
    # Band 0 (uptimes under 1 h): four days after lifetimes fell from ~10 h
    # to ~10 min, the 24 h and 72 h memories (members 3 and 2) hold most of
    # the weight; the never-forgetting one (member 0) almost none.
    assert after[0, 2] + after[0, 3] > 0.9
    assert after[0, 0] < 0.05
    # It was not so before the swing.
    assert weights_before_swing[0, 2] + weights_before_swing[0, 3] < 0.9


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("las", {"model": "mixture"}),
        ("las", {"model": "mixture", "siblings": True}),
        ("lava", {"model": "mixture", "categorical": list(DECLARED_CATEGORICAL)}),
    ],
)
def test_no_oracle_field_reaches_the_mixture(name: str, args: dict[str, Any]) -> None:
    """As ``test_lifetime_no_oracle_leak``: a true, scrambled or absent lifetime changes nothing."""
    absent, tracker = _replay(name, args, "absent")
    model = tracker.model
    assert isinstance(model, MixtureLifeTables)
    for oracle in ("true", "scrambled"):
        hosts, other = _replay(name, args, oracle)
        assert hosts == absent
        assert isinstance(other.model, MixtureLifeTables)
        np.testing.assert_array_equal(other.model.mass, model.mass)
        np.testing.assert_array_equal(other.model.log_weight, model.log_weight)
        np.testing.assert_array_equal(other.slots.predicted_exit, tracker.slots.predicted_exit)
    # It learned: groups filled, and the weights moved off uniform.
    assert model.observations.max() >= 30
    assert not np.allclose(model.weights(), 1.0 / len(model.members))


def test_the_daemon_can_choose_the_mixture() -> None:
    model = LIFETIME_MODELS.build("mixture", None, LifetimeBins.log_spaced(), LifetimeSettings())
    assert isinstance(model, MixtureLifeTables)
    half_lives = [None if not m.decay else math.log(2.0) / m.decay for m in model.members]
    assert half_lives == [
        None,
        pytest.approx(7 * 86_400.0),
        pytest.approx(72 * 3600.0),
        pytest.approx(24 * 3600.0),
    ]


def _learned_mixture() -> tuple[MixtureLifeTables, tuple[int, ...]]:
    model = MixtureLifeTables(_small_bins(), min_observations=1)
    rows = model.rows_for(KEYS)
    model.refit(RunningVMs(np.zeros((0, LEVELS), dtype=np.int64), np.zeros(0)), now=0.0)
    for k, lifetime in enumerate((50.0, 150.0, 400.0, 2000.0)):
        model.observe_exit(rows, lifetime, now=200.0 * k + lifetime)
    model.refit(RunningVMs(np.array([rows]), np.array([700.0])), now=3000.0)
    model.observe_exit(rows, 90.0, now=3500.0)  # pending until the next refit
    return model, rows


def test_the_snapshot_codec_round_trips_the_mixture() -> None:
    model, rows = _learned_mixture()
    copy = state_codec.loads(state_codec.dumps(model))
    assert isinstance(copy, MixtureLifeTables)
    for m in (model, copy):
        m.observe_exit(rows, 300.0, now=5000.0)
        m.refit(RunningVMs(np.array([rows]), np.array([3000.0])), now=6000.0)
    np.testing.assert_array_equal(copy.log_weight, model.log_weight)
    np.testing.assert_array_equal(copy.mass[copy.choose(rows)], model.mass[model.choose(rows)])


def test_bad_settings_fail() -> None:
    with pytest.raises(ValueError, match="member"):
        MixtureLifeTables(_small_bins(), half_lives_s=())
    with pytest.raises(ValueError, match="fixed_share"):
        MixtureLifeTables(_small_bins(), fixed_share=1.0)
    with pytest.raises(ValueError, match="band_edges_s"):
        MixtureLifeTables(_small_bins(), band_edges_s=(10.0, 5.0))


def test_the_evaluation_reports_the_mixture() -> None:
    events = _drifting_events(2)
    result = evaluate_lifetime_model(
        events,
        split_time=6 * 86_400.0,
        end_time=12 * 86_400.0,
        settle_s=86_400.0,
        models=("tables", "mixture"),
        protocol="online",
    )
    names = [m.name for m in result.models]
    assert names == ["life tables", "life tables at four memories, mixed by their log score"]
    tables, mixture = result.models
    # On this swing the mixture follows what the plain tables average away.
    assert mixture.log_score < tables.log_score
