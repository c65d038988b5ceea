"""The compiled LAS/LAVA scan decides exactly as the numpy pipeline does.

Two copies of each lifetime policy, one with the scan and one without,
replay the same real-looking workload on the same heterogeneous pool (some
hosts with GPUs, one drained): every result (host, tie count, scores, and
so the seeded draw) must be equal, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lavad.core.cluster import ClusterState
from lavad.core.placement.framework import Placed, PlacementRequest, PlacementResult
from lavad.core.placement.kernels import (
    Direct,
    _count_exceeds,
    compiled_lava_preference,
    warm_up_lifetime,
)
from lavad.core.placement.lava import preference_cost
from lavad.core.placement.lifetime import LAS_BUCKETS_S
from lavad.core.placement.lifetime_policy import LifetimePolicy
from lavad.core.placement.lifetime_scan import (
    ScanDirect,
    _probed_lifetime_scan,
    warm_up_lifetime_scan,
)
from lavad.core.placement.registry import build_policy, validate_policy_args
from lavad.core.placement.strand_kernels import no_stranding
from lavad.core.placement.waste import NO_GUARD_TEST, WasteGuard
from lavad.models.lifetime.features import ORACLE_FEATURE
from lavad.streams.schema import VmRequest

SHAPES = [(1.0, 2.0, 0.0), (2.0, 4.0, 0.0), (4.0, 16.0, 0.0), (8.0, 32.0, 1.0), (16.0, 64.0, 2.0)]


def _run(
    name: str,
    args: dict[str, Any],
    scan: bool,
    anti_affinity: bool = False,
    limits: tuple[int | None, ...] = (None, 1, 2),
) -> list[PlacementResult]:
    cluster = ClusterState()
    for h in range(24):
        cluster.add_host(f"h{h}", (32.0, 128.0, 0.0, 4.0 if h % 3 == 0 else 0.0))
    cluster.drain_host("h5")
    policy = build_policy(name, validate_policy_args(name, args), np.random.default_rng(9))
    assert isinstance(policy, LifetimePolicy)
    policy.scan = scan
    hooks = policy.hooks
    assert hooks is not None
    rng = np.random.default_rng(21)
    exits: list[tuple[float, str]] = []
    results: list[PlacementResult] = []
    now = 0.0
    for i in range(600):
        now += float(rng.exponential(240.0))
        for when, vm in sorted(exits):
            if when <= now and vm in cluster.vms:
                if when >= hooks.next_deadline:
                    hooks.advance(cluster, when)
                hooks.on_released(cluster, cluster.release(vm), when, exited=True)
        exits = [(w, v) for w, v in exits if v in cluster.vms]
        if now >= hooks.next_deadline:
            hooks.advance(cluster, now)
        cores, memory, gpus = SHAPES[int(rng.integers(len(SHAPES)))]
        # Some VMs never end (a recording without an end time gives the
        # oracle an infinite lifetime): the point cost is then NaN -> last bucket.
        lifetime = float(rng.lognormal(8.0, 2.0)) if i % 50 else float("inf")
        event = VmRequest(
            time=now,
            pool="p",
            vm_id=f"v{i}",
            cores=cores,
            memory_gib=memory,
            gpus=gpus,
            tenant=f"t{rng.integers(8)}",
            features={"qos": ("LS", "BE")[int(rng.integers(2))], ORACLE_FEATURE: lifetime},
        )
        demand = (cores, memory, 0.0, gpus)
        # Batches of four of one deployment (two thirds of the VMs), so the
        # deployment affinity has hosts to prefer; with ``anti_affinity``, two
        # batches in three at most one or two VMs per host, so the anti-affinity
        # blocks hosts (which the scan passes over as the pipeline's filter does).
        deployment = f"d{i // 4}" if i % 3 else ""
        limit = limits[i // 4 % len(limits)] if deployment and anti_affinity else None
        request = PlacementRequest(f"v{i}", demand, deployment, limit, now, event)
        result = policy.place(cluster, request)
        results.append(result)
        if isinstance(result, Placed):
            record = cluster.book(f"v{i}", result.host, demand, deployment, now)
            hooks.on_booked(cluster, record, now, event)
            if lifetime < float("inf"):
                exits.append((now + lifetime, f"v{i}"))
    return results


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("las", {"scoring": "mean"}),
        ("las", {"scoring": "quantiles"}),
        ("las", {"scoring": "quantiles", "quantiles": 1, "tie_break": "first"}),
        ("lava", {"scoring": "mean"}),
        ("lava", {"scoring": "quantiles"}),
        ("las", {"scoring": "quantiles", "host_quantiles": 4}),
        ("lava", {"scoring": "quantiles", "host_quantiles": 3}),
        ("las-oracle", {}),
        ("lava-oracle", {}),
        # The waste guard: the scan runs unguarded and again with the levels
        # only when a tie would add more than the tolerance; the pipeline
        # always scores the levels. A small tolerance makes the guard bind.
        ("las", {"waste_tolerance": 0.005}),
        ("lava", {"waste_tolerance": 0.005}),
        ("las-oracle", {"waste_tolerance": 0.02}),
        # Any positive tolerance is allowed: at 1e-300 the levels past 0 are
        # about 1e298, too large to keep LAVA's preference exact beneath them,
        # which costs nothing (a host of level 0 always fits, and wins), and the
        # guard still decides as the pipeline.
        ("lava", {"waste_tolerance": 1e-300}),
        # The stranding cost: the scan's choice stands unless a tied host
        # strands host time; the pipeline always scores it.
        ("las", {"stranding_cost": True}),
        ("las", {"stranding_cost": True, "host_quantiles": 0}),
        ("lava", {"stranding_cost": True}),
        ("lava", {"stranding_cost": True, "stranding_weight": 16.0}),
        ("las", {"stranding_cost": True, "stranding_weight": 16.0, "tie_break": "first"}),
        ("las-oracle", {"stranding_cost": True}),
        ("lava-oracle", {"stranding_cost": True}),
        # No cost tolerance (the paper's exact order, in the same scan), alone
        # and with each level it takes.
        ("las", {"cost_tolerance": 0.0}),
        ("lava", {"cost_tolerance": 0.0}),
        ("las", {"cost_tolerance": 0.0, "stranding_cost": True}),
        ("lava", {"cost_tolerance": 0.0, "stranding_cost": True}),
        ("las", {"cost_tolerance": 0.0, "waste_tolerance": 0.005}),
        # A cost tolerance: the scan counts stranded host time for every
        # host within reach; the pipeline ties the LAS level's costs within
        # the tolerance of its least.
        ("las", {"cost_tolerance": 0.5}),
        ("lava", {"cost_tolerance": 0.5}),
        ("las", {"cost_tolerance": 0.25, "host_quantiles": 0}),
        ("las", {"cost_tolerance": 0.5, "stranding_cost": False, "tie_break": "first"}),
        ("lava", {"cost_tolerance": 1.0, "waste_tolerance": 0.005}),
        ("las", {"cost_tolerance": 1.0, "scoring": "mean"}),
        ("las-oracle", {"cost_tolerance": 1.0}),
        ("lava-oracle", {"cost_tolerance": 2.0, "stranding_cost": False}),
        # The tolerance a pool sets from what it strands (``tolerance_rule``):
        # this pool strands nothing, so the rule holds the fine one, which the
        # scan must read from the scorer as the pipeline does.
        ("las", {"fine_cost_tolerance": 0.0}),
        ("lava", {"fine_cost_tolerance": 0.125}),
        # The widest tolerance allowed: every host that fits ties, Best Fit decides.
        ("las", {"cost_tolerance": 10.0}),
        # The deployment affinity (on in every case above) off, and alone above
        # LAS without the guard.
        ("las", {"deployment_affinity": False}),
        ("lava", {"deployment_affinity": False}),
        ("las", {"waste_guard": False}),
        ("lava", {"waste_guard": False, "cost_tolerance": 0.0}),
    ],
)
def test_scan_equals_pipeline(name: str, args: dict[str, Any]) -> None:
    compiled = _run(name, args, scan=True)
    pipeline = _run(name, args, scan=False)
    assert compiled == pipeline
    placed = [r for r in compiled if isinstance(r, Placed)]
    # Not vacuous: the pool filled (some requests found no host), and ties
    # were drawn among several hosts.
    assert len(placed) < len(compiled)
    assert any(r.ties > 1 for r in placed)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("las", {}),
        ("lava", {}),
        ("las", {"scoring": "mean"}),
        ("las", {"host_quantiles": 0}),
        ("las", {"waste_tolerance": 0.02}),
        ("lava", {"waste_tolerance": 1e-300}),
        ("las", {"stranding_cost": True}),
        ("lava", {"cost_tolerance": 0.0}),
        ("las", {"waste_guard": False, "deployment_affinity": False}),
        ("las-oracle", {}),
        ("lava-oracle", {}),
    ],
)
def test_scan_equals_pipeline_under_anti_affinity(name: str, args: dict[str, Any]) -> None:
    compiled = _run(name, args, scan=True, anti_affinity=True)
    assert compiled == _run(name, args, scan=False, anti_affinity=True)
    # Not vacuous: the limits moved some placements.
    assert compiled != _run(name, args, scan=True)


@pytest.mark.parametrize("name", ["las", "lava"])
def test_an_absurd_limit_per_host_blocks_nothing(name: str) -> None:
    # A limit no deployment can reach (2^62 VMs a host) marks no host: the
    # decisions are those without limits, and the work is the deployment's hosts.
    absurd = _run(name, {}, scan=True, anti_affinity=True, limits=(2**62,))
    assert absurd == _run(name, {}, scan=True)


@pytest.mark.parametrize("name", ["las", "lava"])
def test_the_deployment_affinity_changes_the_choice(name: str) -> None:
    # Not vacuous above: the workload's batches give the affinity hosts to prefer.
    assert _run(name, {}, scan=True) != _run(name, {"deployment_affinity": False}, scan=True)


@pytest.mark.parametrize("name", ["las", "lava"])
@pytest.mark.parametrize("tolerance", [0.02, 0.005])
def test_under_a_cost_tolerance_the_guard_scores_every_host_only_when_it_must(
    name: str, tolerance: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unguarded choice stands when the guard passes its ties and a host of the
    least cost, first against a bar of 0 (no host scored), then against the real
    bar (every host's level scored, no second scan); only the other placements
    scan again with the levels. All three paths are taken here, and the
    decisions are the pipeline's."""
    args = {"cost_tolerance": 0.5, "waste_tolerance": tolerance}
    scored: list[int] = []
    packed: list[int] = []
    levels, pack = WasteGuard.levels, WasteGuard.pack

    def counting(
        self: WasteGuard, cluster: ClusterState, request: PlacementRequest, out: Any
    ) -> None:
        scored.append(1)
        levels(self, cluster, request, out)

    def counting_packs(self: WasteGuard, *given: Any) -> None:
        packed.append(1)
        pack(self, *given)

    monkeypatch.setattr(WasteGuard, "levels", counting)
    monkeypatch.setattr(WasteGuard, "pack", counting_packs)
    compiled = _run(name, args, scan=True)
    rescans, scans_again = len(scored), len(packed)
    monkeypatch.setattr(WasteGuard, "levels", levels)
    monkeypatch.setattr(WasteGuard, "pack", pack)
    assert compiled == _run(name, args, scan=False)
    placed = sum(isinstance(r, Placed) for r in compiled)
    assert 0 < scans_again < rescans < placed, (scans_again, rescans, placed)


@pytest.mark.parametrize("name", ["las", "lava"])
def test_a_cost_tolerance_changes_the_choice(name: str) -> None:
    # Not a no-op: hosts within the tolerance tie, so Best Fit overrules LAS's
    # least cost on some placements.
    exact = _run(name, {"cost_tolerance": 0.0}, scan=True)
    tolerant = _run(name, {"cost_tolerance": 0.5}, scan=True)
    assert exact != tolerant


@pytest.mark.parametrize("name", ["las", "lava", "la-binary"])
@pytest.mark.parametrize("value", [-1.0, 10.5, 1e308, float("inf"), float("nan"), "wide"])
def test_an_absurd_cost_tolerance_is_refused_at_start_naming_the_key(
    name: str, value: object
) -> None:
    with pytest.raises(ValueError, match="cost_tolerance"):
        validate_policy_args(name, {"cost_tolerance": value})


def test_la_binary_refuses_a_cost_tolerance() -> None:
    with pytest.raises(ValueError, match="cost_tolerance"):
        validate_policy_args("la-binary", {"cost_tolerance": 0.25})


def test_compiled_lava_preference_equals_numpy() -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        phase = rng.integers(0, 3, size=n).astype(np.int8)
        host_class = rng.integers(-1, 5, size=n).astype(np.int8)
        vm_count = rng.integers(0, 3, size=n).astype(np.int32)
        vm_class = int(rng.integers(-1, 5))  # -1: a VM without a class
        expected = np.zeros(n)
        preference_cost(phase, host_class, vm_count == 0, vm_class, expected)
        got = np.zeros(n)
        compiled_lava_preference(phase, host_class, vm_count, n, vm_class, got, False, got)
        np.testing.assert_array_equal(got, expected)
        # On a level packed above it (the deployment affinity's 0 or 16), in place.
        levels = 16.0 * rng.integers(0, 2, size=n)
        packed = levels.copy()
        compiled_lava_preference(phase, host_class, vm_count, n, vm_class, packed, True, packed)
        np.testing.assert_array_equal(packed, levels + expected)


def test_one_comparison_bound_equals_the_count() -> None:
    """The scan skips a host's threshold search when one comparison shows the
    count exceeds what the best host costs; that test must agree with the count.

    By hand: thresholds [1, 2, 2, 5], remaining 2: searchsorted(left) = 1, so
    3 thresholds are at or above it. That exceeds a budget of 2 (k = 4 - 2,
    the 2nd smallest threshold, 2, is >= 2) and not one of 3 (k = 1, the
    smallest, 1, is below 2).
    """
    thresholds = np.array([1.0, 2.0, 2.0, 5.0])
    assert _count_exceeds(thresholds, 2.0, 2.0)
    assert not _count_exceeds(thresholds, 2.0, 3.0)
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        values = np.sort(rng.integers(-5, 6, size=n).astype(np.float64))
        choices = [*values.tolist(), -np.inf, np.inf, np.nan, *rng.normal(0, 4, 4).tolist()]
        remaining = float(rng.choice(choices))
        budget = float(rng.integers(0, n + 3))
        count = n - int(np.searchsorted(values, remaining, side="left"))
        assert _count_exceeds(values, remaining, budget) == (count > budget)


def test_direct_entry_points_decide_as_the_dispatchers() -> None:
    """After the warm-up the policies call the kernels' compiled code without
    numba's dispatch; scalars are still converted to the signature's types (a
    whole-number time as an int gives the float's answer)."""
    warm_up_lifetime()
    warm_up_lifetime_scan()
    assert ScanDirect.probed is not _probed_lifetime_scan
    assert Direct.lava_preference is not compiled_lava_preference
    free = np.array([[4.0, 8.0, 2.0], [16.0, 32.0, 8.0], [0.0] * 3, [0.0] * 3])
    inv_capacity = np.full((4, 3), 1.0 / 32.0)
    exits = np.array([7200.0, 100.0, -np.inf])
    ties_direct = np.zeros(3, dtype=np.int64)
    ties_dispatch = np.zeros(3, dtype=np.int64)
    pool = (
        free, inv_capacity, np.zeros(3, dtype=np.bool_), np.array([True, True, False, False]),
        np.ones(4),
    )  # fmt: skip
    las = (exits, np.zeros(0), False, LAS_BUCKETS_S, np.zeros((0, 0)), False)
    preferred = (np.zeros(3), False, NO_GUARD_TEST)
    request = (3, 2.0, 8.0, 0.0, 0.0, 1e-9, 3600.0, 5400.0, 0.0)
    dispatched = _probed_lifetime_scan(
        pool, request, preferred, las, ties_dispatch, -1, no_stranding()
    )
    assert dispatched[0] >= 1
    # Any probe host, or none, gives the same answer (it only bounds the search).
    whole = (3, 2, 8, 0.0, 0.0, 1e-9, 3600, 5400, 0)
    for probe in (-1, 0, 1, 2, 7):
        direct = ScanDirect.probed(pool, whole, preferred, las, ties_direct, probe, no_stranding())
        assert direct == dispatched
        assert ties_direct.tolist() == ties_dispatch.tolist()


def test_an_entry_point_refuses_arguments_of_other_types_on_its_first_call() -> None:
    """Without dispatch an array of another type would be read as the wrong memory:
    the first call after a warm-up checks the types and names the one that differs."""
    warm_up_lifetime_scan()
    free = np.ones((4, 2))
    pool = (
        free, free, np.zeros(2, dtype=np.bool_), np.ones(4, dtype=np.bool_),
        np.ones(4, dtype=np.float32),  # Best Fit's weights as float32, not float64
    )  # fmt: skip
    las = (np.zeros(2), np.zeros(0), False, LAS_BUCKETS_S, np.zeros((0, 0)), False)
    request = (2, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 60.0, 0.0)
    ties = np.zeros(2, dtype=np.int64)
    preferred = (np.zeros(2), False, NO_GUARD_TEST)
    with pytest.raises(TypeError, match="argument 0"):
        ScanDirect.probed(pool, request, preferred, las, ties, -1, no_stranding())
    # A refused call leaves the check in place: the next one is checked again.
    with pytest.raises(TypeError, match="argument 0"):
        ScanDirect.probed(pool, request, preferred, las, ties, -1, no_stranding())


def test_an_entry_point_gives_way_to_the_compiled_code_once_its_first_call_passed() -> None:
    """The checking wrapper costs a call in Python on every placement: after one
    call whose types passed, the holder's attribute is the compiled code itself."""
    warm_up_lifetime()
    wrapper = Direct.over_threshold
    capacity = np.full((4, 2), 10.0)
    # Host 0 has 0.5 of 10 cores free (95% booked), host 1 half its cores.
    free = np.array([[0.5, 5.0], [10.0, 10.0], [10.0, 10.0], [10.0, 10.0]])
    assert wrapper(capacity, free, 0, 0.9)
    assert Direct.over_threshold is not wrapper
    assert not Direct.over_threshold(capacity, free, 1, 0.9)
    assert Direct.over_threshold(capacity, free, 0, 0.9)
