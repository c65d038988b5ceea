"""Online usage moments (Welford) and per-host sums, against numpy on a real trace slice."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from lavad.models.usage.hosts import HostUsage, UsagePrior
from lavad.models.usage.moments import CPU, MEMORY, UsageMoments
from lavad.streams.adapters import open_trace
from lavad.streams.schema import UsageSample, UsageStats

SLICE = Path(__file__).resolve().parents[1] / "data" / "google-2011-gcd-slice"


def _samples(path: Path) -> list[UsageSample]:
    return [e for e in open_trace(path).events() if isinstance(e, UsageSample)]


@pytest.fixture(scope="module")
def slice_samples() -> list[UsageSample]:
    return _samples(SLICE)


def _series(samples: list[UsageSample]) -> dict[str, dict[int, list[tuple[float, float]]]]:
    series: dict[str, dict[int, list[tuple[float, float]]]] = defaultdict(
        lambda: {CPU: [], MEMORY: []}
    )
    for s in samples:
        series[s.vm_id][CPU].append((s.time, s.cpu.mean))
        if s.memory is not None:
            series[s.vm_id][MEMORY].append((s.time, s.memory.mean))
    return series


def test_welford_matches_numpy_on_the_slice(slice_samples: list[UsageSample]) -> None:
    moments = UsageMoments()
    for sample in slice_samples:
        moments.observe_sample(sample)
    series = _series(slice_samples)
    assert len(moments) == len(series) == 16
    for vm_id, by_resource in series.items():
        for resource, points in by_resource.items():
            values = np.array([v for _, v in points])
            estimate = moments.estimate(vm_id, resource)
            assert estimate is not None
            assert estimate.samples == len(values) == 576
            assert estimate.mean == pytest.approx(values.mean(), rel=1e-12, abs=1e-15)
            assert estimate.variance == pytest.approx(values.var(ddof=1), rel=1e-10, abs=1e-15)
            assert estimate.population_variance == pytest.approx(values.var(), rel=1e-10)
            assert estimate.effective_samples == pytest.approx(len(values))


def test_welford_is_stable_under_a_large_offset(slice_samples: list[UsageSample]) -> None:
    # Sum of squares minus square of sums loses every digit here (1e16 vs ~1e-3);
    # Welford keeps the variance to float precision of the offset (1e8 * 2^-52 ~ 2e-8).
    offset = 1e8
    moments = UsageMoments()
    first = slice_samples[0].vm_id
    values = np.array([s.cpu.mean for s in slice_samples if s.vm_id == first])
    for i, value in enumerate(values):
        moments.observe(first, CPU, 300.0 * (i + 1), offset + float(value))
    estimate = moments.estimate(first, CPU)
    assert estimate is not None
    assert estimate.variance == pytest.approx(values.var(ddof=1), rel=1e-4)
    naive = (np.sum((offset + values) ** 2) - np.sum(offset + values) ** 2 / len(values)) / (
        len(values) - 1
    )
    # The point of Welford: the textbook formula is off by orders of magnitude here.
    assert abs(naive - values.var(ddof=1)) > 10 * abs(estimate.variance - values.var(ddof=1))


def test_decayed_moments_match_weighted_numpy(slice_samples: list[UsageSample]) -> None:
    half_life = 6 * 3600.0
    moments = UsageMoments(half_life_s=half_life)
    for sample in slice_samples:
        moments.observe_sample(sample)
    for vm_id, by_resource in _series(slice_samples).items():
        times = np.array([t for t, _ in by_resource[CPU]])
        values = np.array([v for _, v in by_resource[CPU]])
        weights = 2.0 ** (-(times[-1] - times) / half_life)
        w, w2 = weights.sum(), (weights**2).sum()
        mean = float((weights * values).sum() / w)
        variance = float((weights * (values - mean) ** 2).sum() / (w - w2 / w))
        estimate = moments.estimate(vm_id, CPU)
        assert estimate is not None
        assert estimate.mean == pytest.approx(mean, rel=1e-9)
        assert estimate.variance == pytest.approx(variance, rel=1e-8)
        assert estimate.effective_samples == pytest.approx(w * w / w2, rel=1e-9)
        # 576 weights d^k, d = 2^(-300 / 21600): a geometric series, whose effective
        # size (sum d^k)^2 / sum d^2k = (1 - d^n)^2 (1 + d) / ((1 - d)(1 - d^2n)) = 206.13.
        d, n = 2.0 ** (-300.0 / half_life), len(values)
        closed = (1 - d**n) ** 2 * (1 + d) / ((1 - d) * (1 - d ** (2 * n)))
        assert estimate.effective_samples == pytest.approx(closed, rel=1e-9)


def test_decay_follows_a_level_shift() -> None:
    # The later day's level dominates a decayed mean, not an undecayed one.
    decayed, flat = UsageMoments(half_life_s=3600.0), UsageMoments()
    for i in range(288):
        value = 0.1 if i < 144 else 0.6
        decayed.observe("a", CPU, 300.0 * (i + 1), value)
        flat.observe("a", CPU, 300.0 * (i + 1), value)
    d, f = decayed.estimate("a", CPU), flat.estimate("a", CPU)
    assert d is not None and f is not None
    assert f.mean == pytest.approx(0.35)
    assert d.mean > 0.59


def test_moments_reject_bad_arguments() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="half_life_s"):
            UsageMoments(half_life_s=bad)
    with pytest.raises(ValueError, match="finite"):
        UsageMoments().observe("a", CPU, 0.0, math.nan)
    with pytest.raises(ValueError, match="min_samples"):
        UsagePrior(min_samples=0)


def test_host_sums_stay_equal_to_a_recount(slice_samples: list[UsageSample]) -> None:
    """Place, exit and update in O(1); the sums always equal a recount from the VMs."""
    rng = np.random.default_rng(5)
    moments = UsageMoments(half_life_s=12 * 3600.0, initial_slots=2)
    usage = HostUsage(moments, UsagePrior(min_samples=12), initial_columns=1)
    vm_ids = sorted({s.vm_id for s in slice_samples})
    scale = {vm: (float(rng.integers(1, 9)), float(rng.integers(1, 33))) for vm in vm_ids}
    for index, sample in enumerate(slice_samples):
        usage.observe(sample)
        if index % 97 == 0:
            vm = vm_ids[int(rng.integers(len(vm_ids)))]
            if vm in usage:
                usage.remove(vm)
            else:
                usage.place(vm, int(rng.integers(0, 6)), scale[vm])
        if index % 499 == 0:
            # Rows: mean, variance, third and fourth cumulant sums; columns: hosts.
            expected = np.zeros((4, 2, usage.mean_sum.shape[1]))
            for vm in vm_ids:
                host = usage.host_of(vm)
                if host is None:
                    continue
                c = usage.contribution(vm, scale[vm])
                expected[:, :, host] += np.reshape(c, (4, 2))
            sums = (usage.mean_sum, usage.variance_sum, usage.third_sum, usage.fourth_sum)
            for actual, recount in zip(sums, expected, strict=True):
                np.testing.assert_allclose(actual, recount, atol=1e-9)
    for vm in vm_ids:
        usage.remove(vm)
    assert not usage.mean_sum.any() and not usage.variance_sum.any()
    assert not usage.third_sum.any() and not usage.fourth_sum.any()
    assert not usage.vm_count.any() and not usage.prior_count.any()


def test_prior_until_enough_samples() -> None:
    moments = UsageMoments()
    usage = HostUsage(moments, UsagePrior(mean_fraction=1.0, min_samples=3))
    usage.place("a", 0, (4.0, 8.0))
    # No observation yet: the whole request, no variance (the hard fit).
    assert usage.mean_sum[CPU, 0] == 4.0 and usage.variance_sum[CPU, 0] == 0.0
    for i, value in enumerate((0.2, 0.4, 0.6)):
        usage.observe(
            UsageSample(
                time=300.0 * (i + 1), pool="p", vm_id="a", interval_s=300.0, cpu=_stats(value)
            )
        )
    assert usage.mean_sum[CPU, 0] == pytest.approx(4.0 * 0.4)
    assert usage.variance_sum[CPU, 0] == pytest.approx(16.0 * 0.04)
    # Memory never observed: still the prior.
    assert usage.mean_sum[MEMORY, 0] == 8.0
    with pytest.raises(ValueError, match="already placed"):
        usage.place("a", 1, (4.0, 8.0))


def _stats(value: float) -> UsageStats:
    return UsageStats(mean=value, peak=value)


@pytest.mark.shared_data
@pytest.mark.parametrize("trace", ["bitbrains-rnd", "azure-v1-cpu"])
def test_welford_matches_numpy_on_full_traces(shared_data: Path, trace: str) -> None:
    samples = _samples(shared_data / trace)
    moments = UsageMoments()
    for sample in samples:
        moments.observe_sample(sample)
    series = _series(samples)
    for vm_id, by_resource in list(series.items())[:40]:
        values = np.array([v for _, v in by_resource[CPU]])
        estimate = moments.estimate(vm_id, CPU)
        assert estimate is not None
        assert estimate.mean == pytest.approx(values.mean(), rel=1e-11, abs=1e-15)
        assert estimate.variance == pytest.approx(values.var(ddof=1), rel=1e-9, abs=1e-15)


def test_usage_of_vms_never_placed_is_bounded_and_counted() -> None:
    """A flood of unknown VM ids keeps at most max_unplaced histories, oldest out first; a
    placed VM is never evicted, and an exited one is forgotten."""
    usage = HostUsage(UsageMoments(), UsagePrior(min_samples=1), max_unplaced=20)
    usage.place("placed", 0, (1.0, 1.0))
    for k in range(1_000):
        stats = UsageStats(mean=0.5, peak=0.5)
        usage.observe(
            UsageSample(time=300.0 * k, pool="p", vm_id=f"x{k}", interval_s=300.0, cpu=stats)
        )
        usage.observe(
            UsageSample(time=300.0 * k, pool="p", vm_id="placed", interval_s=300.0, cpu=stats)
        )
    assert usage.unplaced == 20 and len(usage.moments) == 21
    assert usage.evicted == 1_000 - 20
    assert "x999" in usage.moments and "x0" not in usage.moments
    assert "placed" in usage.moments
    # Released (evicted, not exited): its history stays among the unplaced.
    usage.remove("placed")
    assert usage.unplaced == 20 and "placed" in usage.moments
    assert usage.forget("placed") and "placed" not in usage.moments
