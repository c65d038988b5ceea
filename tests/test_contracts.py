"""One contract per kind of model, run over every entry of its registry.

As river's ``check_estimator`` does for an estimator: every registered
lifetime model, placement policy and limit recommender must be
deterministic, leave its inputs as they were, come back from a checkpoint
(the snapshot codec's ``dumps``/``loads``) deciding what it would have
decided, and get a small case worked out by hand right. The cases are
parametrized over the registries, so a new entry is checked without a line
here. The streams are small fakes, generated once from a fixed seed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.limits.service import RECOMMENDER_REGISTRY
from lavad.core.placement.framework import Placed, PlacementRequest, Policy, Unfit
from lavad.core.placement.lifetime import LIFETIME_MODELS, LifetimeSettings
from lavad.core.placement.registry import REGISTRY, build_policy, validate_policy_args
from lavad.daemon.live.state_codec import dumps, loads
from lavad.models.arrays import FloatArray
from lavad.models.lifetime.bins import LifetimeBins
from lavad.models.lifetime.features import ORACLE_FEATURE, lifetime_keys
from lavad.models.lifetime.protocol import GroupRows, LifetimeModel, RunningVMs
from lavad.models.limits.histogram import BucketScheme, Observation
from lavad.models.limits.window import LimitRecommender
from lavad.streams.schema import VmRequest

HOUR = 3600.0
LIFETIME_NAMES = sorted(LIFETIME_MODELS.names)
POLICY_NAMES = sorted(REGISTRY.names)
RECOMMENDER_NAMES = sorted(RECOMMENDER_REGISTRY.names)


def _round_trip(value: Any) -> Any:
    """``value`` as a snapshot would bring it back."""
    return loads(dumps(value))


# ---------------------------------------------------------------- lifetime models

# One fake stream of a pool's VMs: (kind, time, vm, tenant). Kinds: request,
# exit, evict, refit (hourly, with the running VMs censored) and recount
# (a sibling's exit recounts its owner group, as ``siblings`` does).
LifetimeEvent = tuple[str, float, int, str]


def _lifetime_stream(seed: int = 7, vms: int = 120) -> list[LifetimeEvent]:
    rng = np.random.default_rng(seed)
    events: list[LifetimeEvent] = []
    for vm in range(vms):
        start = float(rng.uniform(0.0, 30 * HOUR))
        tenant = f"t{int(rng.integers(4))}"
        events.append(("request", start, vm, tenant))
        lifetime = float(rng.lognormal(np.log(2 * HOUR), 1.5))
        if start + lifetime < 36 * HOUR:
            kind = "evict" if rng.random() < 0.1 else "exit"
            events.append((kind, start + lifetime, vm, tenant))
            if kind == "exit" and rng.random() < 0.3:
                events.append(("recount", start + lifetime, vm, tenant))
    events += [("refit", hour * HOUR + 0.5, -1, "") for hour in range(1, 37)]
    events.sort(key=lambda event: (event[1], event[0], event[2]))
    return events


STREAM = _lifetime_stream()


def _keys(tenant: str) -> tuple[object, ...]:
    return lifetime_keys(tenant, 2.0, 8.0, "", {}, deployment="", categorical=())


@dataclass
class _Fleet:
    """The running VMs a tracker would hold, fed to a model from the fake stream."""

    running: dict[int, tuple[GroupRows, float, int]] = field(default_factory=dict)
    predictions: list[tuple[int, bytes]] = field(default_factory=list)
    # Check that the model leaves the caller's arrays as given.
    strict: bool = True

    def feed(self, model: LifetimeModel, events: list[LifetimeEvent]) -> None:
        for kind, now, vm, tenant in events:
            if kind == "request":
                rows = model.rows_for(_keys(tenant))
                chosen = model.choose(rows)
                self.predictions.append((chosen, model.mass[chosen].tobytes()))
                self.running[vm] = (rows, now, chosen)
            elif kind in ("exit", "evict"):
                rows, start, _ = self.running.pop(vm)
                if kind == "exit":
                    model.observe_exit(rows, now - start, now)
                else:
                    model.observe_censored(rows, now - start, now)
            elif kind == "recount":
                owner = model.rows_for(_keys(tenant))[0]
                uptimes = np.array(
                    [now - start for rows, start, _ in self.running.values() if rows[0] == owner]
                )
                given = uptimes.copy()
                model.observe_running(owner, uptimes, now)
                assert not self.strict or np.array_equal(uptimes, given)
            else:
                self._refit(model, now)

    def _refit(self, model: LifetimeModel, now: float) -> None:
        vms = sorted(self.running)
        rows = np.array([self.running[vm][0] for vm in vms], dtype=np.int64).reshape(len(vms), -1)
        uptimes: FloatArray = np.array([now - self.running[vm][1] for vm in vms])
        chosen = np.array([self.running[vm][2] for vm in vms], dtype=np.int64)
        given = (rows.copy(), uptimes.copy(), chosen.copy())
        model.refit(RunningVMs(rows, uptimes, chosen), now=now)
        if self.strict:
            for array, before in zip((rows, uptimes, chosen), given, strict=True):
                assert np.array_equal(array, before), "refit changed its caller's arrays"
        # The running VMs are repredicted after a refit, as the tracker does.
        for vm in vms:
            group_rows, start, _ = self.running[vm]
            self.running[vm] = (group_rows, start, model.choose(group_rows))


def _lifetime_model(name: str) -> LifetimeModel:
    settings = LifetimeSettings(min_observations=2)
    return LIFETIME_MODELS.build(name, None, LifetimeBins.log_spaced(), settings)


@pytest.mark.parametrize("name", LIFETIME_NAMES)
def test_a_lifetime_model_is_a_lifetime_model(name: str) -> None:
    model = _lifetime_model(name)
    assert isinstance(model, LifetimeModel)
    assert isinstance(model.pure_choice, bool)
    assert isinstance(model.counts_plainly(), bool)
    assert isinstance(model.counts_by_age, bool)
    if not model.counts_by_age:
        # A weight that does not depend on the VM's creation is a plain count.
        assert model.count_weight(3_600.0) == 1.0


@pytest.mark.parametrize("name", LIFETIME_NAMES)
def test_a_lifetime_model_is_deterministic_and_leaves_its_inputs(name: str) -> None:
    first, second = _Fleet(), _Fleet()
    one, other = _lifetime_model(name), _lifetime_model(name)
    first.feed(one, STREAM)
    second.feed(other, STREAM)
    assert len(first.predictions) == 120
    assert first.predictions == second.predictions
    np.testing.assert_array_equal(one.mass, other.mass)
    # It learned: the predictions are not all the prior's.
    assert len({mass for _, mass in first.predictions}) > 1


@pytest.mark.parametrize("name", LIFETIME_NAMES)
def test_a_lifetime_model_predicts_the_same_after_a_checkpoint(name: str) -> None:
    half = len(STREAM) // 2
    fleet, model = _Fleet(), _lifetime_model(name)
    fleet.feed(model, STREAM[:half])
    restored = _round_trip(model)
    assert type(restored) is type(model)
    for array in ("mass", "m0", "m1", "deaths", "censored"):
        np.testing.assert_array_equal(getattr(restored, array), getattr(model, array))
    other = copy.deepcopy(fleet)
    fleet.feed(model, STREAM[half:])
    other.feed(restored, STREAM[half:])
    assert other.predictions == fleet.predictions
    np.testing.assert_array_equal(restored.mass, model.mass)


@pytest.mark.parametrize("name", LIFETIME_NAMES)
def test_a_lifetime_model_counts_the_running_as_censored(name: str) -> None:
    """Worked by hand: of four VMs created together, two die within an hour's bin and
    two are still running at 10 h. The Kaplan-Meier estimate puts half the mass in
    that bin and none before it; a model ignoring the running VMs would put all of it
    there. With every level holding the same VMs, every model's variant agrees (the
    shrunk levels, the mixture's memories, a frailty and a recalibration with no
    evidence leave the tables' row as it is)."""
    model = _lifetime_model(name)
    bins = model.bins
    lived = 1.4 * HOUR
    died_in = int(bins.index(np.array([lived]))[0])
    assert int(bins.index(np.array([10 * HOUR]))[0]) > died_in
    rows = model.rows_for(_keys("t"))
    model.observe_exit(rows, lived, lived)
    model.observe_exit(rows, lived, lived)
    running = np.array([rows, rows], dtype=np.int64)
    model.refit(RunningVMs(running, np.array([10 * HOUR, 10 * HOUR])), now=10 * HOUR)
    mass = model.mass[model.choose(rows)]
    assert mass[:died_in].sum() == pytest.approx(0.0, abs=1e-12)
    assert mass[died_in] == pytest.approx(0.5, abs=1e-9)
    assert mass.sum() == pytest.approx(1.0, abs=1e-9)


# ---------------------------------------------------------------- placement policies

SHAPES = ((1.0, 2.0), (2.0, 8.0), (4.0, 16.0), (8.0, 32.0))


def _vm_request(
    i: int, cores: float, memory: float, lifetime: float, now: float | None = None
) -> PlacementRequest:
    now = float(i) if now is None else now
    event = VmRequest(
        time=now,
        pool="p",
        vm_id=f"v{i}",
        tenant=f"t{i % 3}",
        cores=cores,
        memory_gib=memory,
        features={ORACLE_FEATURE: lifetime},
    )
    return PlacementRequest(f"v{i}", (cores, memory, 0.0, 0.0), "", None, now, event)


@dataclass
class _Pool:
    """A pool as the engine drives it: a cluster, a policy and its hooks."""

    cluster: ClusterState
    policy: Policy
    decisions: list[int | None] = field(default_factory=list)
    ends: dict[str, float] = field(default_factory=dict)

    @classmethod
    def start(cls, name: str, seed: int = 3, args: dict[str, Any] | None = None) -> _Pool:
        cluster = ClusterState()
        for h in range(8):
            cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
        checked = validate_policy_args(name, args or {})
        policy = build_policy(name, checked, np.random.default_rng(seed))
        return cls(cluster, policy)

    def request(self, request: PlacementRequest, lifetime: float) -> Placed | Unfit:
        now = request.now
        self._release_until(now)
        hooks = self.policy.hooks
        if hooks is not None and now >= hooks.next_deadline:
            hooks.advance(self.cluster, now)
        free = self.cluster.free.copy()
        asked = copy.deepcopy((request.vm_id, request.demand, request.now, request.event))
        result = self.policy.place(self.cluster, request)
        assert np.array_equal(free, self.cluster.free), "place() changed the cluster"
        assert asked == (request.vm_id, request.demand, request.now, request.event)
        if isinstance(result, Placed):
            record = self.cluster.book(request.vm_id, result.host, request.demand, "", now)
            if hooks is not None:
                hooks.on_booked(self.cluster, record, now, request.event)
            self.ends[request.vm_id] = now + lifetime
            self.decisions.append(result.host)
        else:
            self.decisions.append(None)
        return result

    def _release_until(self, now: float) -> None:
        hooks = self.policy.hooks
        for vm_id, end in sorted(self.ends.items(), key=lambda item: (item[1], item[0])):
            if end > now:
                break
            del self.ends[vm_id]
            record = self.cluster.release(vm_id)
            if hooks is not None:
                hooks.on_released(self.cluster, record, end, exited=True)


def _placement_stream(seed: int = 11, vms: int = 160) -> list[tuple[PlacementRequest, float]]:
    """A request every 2 minutes for 5 h, living 40 minutes on average: the lifetime
    policies refit (hourly) and repredict VMs that outlive their prediction."""
    rng = np.random.default_rng(seed)
    stream = []
    for i in range(vms):
        cores, memory = SHAPES[int(rng.integers(len(SHAPES)))]
        lifetime = float(rng.exponential(2400.0))
        stream.append((_vm_request(i, cores, memory, lifetime, now=120.0 * i), lifetime))
    return stream


PLACEMENTS = _placement_stream()


def _placed(pool: _Pool, stream: list[tuple[PlacementRequest, float]]) -> list[int | None]:
    for request, lifetime in stream:
        pool.request(copy.deepcopy(request), lifetime)
    return pool.decisions


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_policy_is_deterministic_and_leaves_its_inputs(name: str) -> None:
    first = _placed(_Pool.start(name), PLACEMENTS)
    assert first == _placed(_Pool.start(name), PLACEMENTS)
    assert any(host is not None for host in first)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_policy_places_the_same_after_a_checkpoint(name: str) -> None:
    half = len(PLACEMENTS) // 2
    pool = _Pool.start(name)
    _placed(pool, PLACEMENTS[:half])
    # What a snapshot holds: the cluster and the policy (the engine's pool state).
    cluster, policy = _round_trip((pool.cluster, pool.policy))
    restored = _Pool(cluster, policy, list(pool.decisions), dict(pool.ends))
    assert _placed(restored, PLACEMENTS[half:]) == _placed(pool, PLACEMENTS[half:])


@pytest.mark.parametrize("name", ["las", "lava"])
def test_a_host_life_of_all_vms_holds_the_contract(name: str) -> None:
    """The option that is not a default, through the same checks: deterministic, and
    the same placements after a checkpoint, with hosts' quantiles from all their VMs."""
    args = {"host_life": "all_vms"}
    first = _placed(_Pool.start(name, args=args), PLACEMENTS)
    assert first == _placed(_Pool.start(name, args=args), PLACEMENTS)
    half = len(PLACEMENTS) // 2
    pool = _Pool.start(name, args=args)
    _placed(pool, PLACEMENTS[:half])
    cluster, policy = _round_trip((pool.cluster, pool.policy))
    restored = _Pool(cluster, policy, list(pool.decisions), dict(pool.ends))
    assert _placed(restored, PLACEMENTS[half:]) == _placed(pool, PLACEMENTS[half:])


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_policy_places_where_only_one_host_fits(name: str) -> None:
    """Worked by hand: of three 16-core hosts, one holds 12 cores and one drains, so
    an 8-core VM fits the third only; a 32-core VM fits none."""
    cluster = ClusterState()
    for h in range(3):
        cluster.add_host(f"h{h}", (16.0, 64.0, 0.0, 0.0))
    policy = build_policy(name, validate_policy_args(name, {}), np.random.default_rng(0))
    pool = _Pool(cluster, policy)
    assert isinstance(pool.request(_vm_request(0, 12.0, 16.0, 1000.0), 1000.0), Placed)
    busy = pool.decisions[0]
    assert busy is not None
    draining = (busy + 1) % 3
    cluster.drain_host(f"h{draining}")
    free = 3 - busy - draining
    result = pool.request(_vm_request(1, 8.0, 16.0, 1000.0), 1000.0)
    assert isinstance(result, Placed) and result.host == free
    assert isinstance(pool.request(_vm_request(2, 32.0, 16.0, 1000.0), 1000.0), Unfit)


# ---------------------------------------------------------------- limit recommenders


def _usage(seed: int = 5, windows: int = 60) -> list[Observation]:
    rng = np.random.default_rng(seed)
    observations = []
    for w in range(windows):
        values = tuple(float(v) for v in rng.gamma(4.0, 0.5, size=6))
        observations.append(
            Observation(end=300.0 * (w + 1), values=values, peak=max(values), usage=2.0)
        )
    return observations


USAGE = _usage()


def _limits(recommender: LimitRecommender, observations: list[Observation]) -> list[float | None]:
    limits = []
    for obs in observations:
        given = copy.deepcopy(obs)
        recommender.observe(obs)
        assert obs == given
        limit = recommender.limit
        if limit is not None and obs.peak > limit:
            recommender.on_overrun(obs.end, limit)
        limits.append(recommender.limit)
    return limits


@pytest.mark.parametrize("resource", ["cpu", "memory"])
@pytest.mark.parametrize("name", RECOMMENDER_NAMES)
def test_a_recommender_is_deterministic_and_leaves_its_inputs(name: str, resource: str) -> None:
    first = RECOMMENDER_REGISTRY.build(name, None, resource)
    assert first.limit is None  # nothing observed, nothing to say
    limits = _limits(first, USAGE)
    second = RECOMMENDER_REGISTRY.build(name, None, resource)
    assert _limits(second, USAGE) == limits
    assert first.explain() == second.explain()
    assert all(limit is not None and limit > 0 for limit in limits)


@pytest.mark.parametrize("resource", ["cpu", "memory"])
@pytest.mark.parametrize("name", RECOMMENDER_NAMES)
def test_a_recommender_recommends_the_same_after_a_checkpoint(name: str, resource: str) -> None:
    half = len(USAGE) // 2
    recommender = RECOMMENDER_REGISTRY.build(name, None, resource)
    _limits(recommender, USAGE[:half])
    restored = _round_trip(recommender)
    assert restored.limit == recommender.limit
    assert _limits(restored, USAGE[half:]) == _limits(recommender, USAGE[half:])
    assert restored.explain() == recommender.explain()


@pytest.mark.parametrize("resource", ["cpu", "memory"])
@pytest.mark.parametrize("name", RECOMMENDER_NAMES)
def test_a_recommender_covers_a_flat_signal(name: str, resource: str) -> None:
    """Worked by hand: a job using 2.0 in every window for a day. Every statistic of a
    flat signal is its histogram bucket's upper bound b (2.00405 in the default
    scheme: the first bound at or above 2.0); the moving windows add their 10% margin
    to it, exactly; no recommender may go below the usage (it would overrun every
    window), nor above it by more than the largest margin (15%) over a bucket of the
    coarsest histogram (the VPA's, 5% wide)."""
    recommender = RECOMMENDER_REGISTRY.build(name, None, resource)
    for w in range(288):
        recommender.observe(
            Observation(end=300.0 * (w + 1), values=(2.0,) * 3, peak=2.0, usage=2.0)
        )
    limit = recommender.limit
    assert limit is not None
    assert 2.0 <= limit <= 2.0 * 1.15 * 1.05
    if name.startswith("window-"):
        bounds = np.asarray(BucketScheme.default().bounds)
        bound = float(bounds[np.searchsorted(bounds, 2.0)])
        assert bound == pytest.approx(2.00405, abs=1e-5)
        assert limit == pytest.approx(1.10 * bound, rel=1e-12)
