"""Evaluations that take a trace's VMs as rows keep each pool's VMs apart.

A JSON-lines trace may hold several pools, and a VM id is its pool's: the
engine keys VMs by (pool, id). The cases copy a bundled real slice into two
pools, ``a`` and ``b``, with the same VM ids. Keyed by id alone, each VM's two
copies became one row with two readings per window (the limits), one series
twice as long (GPA), or one app with double the instances (horizontal).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from lavad.evaluation.gpa_aligned import load_aligned_windows
from lavad.evaluation.gpa_live_relief import window_samples
from lavad.evaluation.gpa_sweep import load_usage_series
from lavad.evaluation.limits import load_jobs
from lavad.evaluation.limits_horizontal import instance_counts
from lavad.streams.trace_tools import convert

ROOT = Path(__file__).resolve().parents[1]
LIMITS_SLICE = ROOT / "data" / "google-2011-gcd-limits-slice"
AZURE_SLICE = ROOT / "data" / "azure-v1-vms-slice"


def _two_pools(slice_: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The slice as JSON lines in pool ``a``, and the same lines again in pool ``b``."""
    one = tmp_path / f"{slice_.name}.jsonl"
    convert(slice_, one)
    lines = one.read_bytes().splitlines()
    both = tmp_path / f"{slice_.name}-two-pools.jsonl"
    with both.open("wb") as sink:
        for pool in ("a", "b"):
            for line in lines:
                record = orjson.loads(line)
                record["pool"] = pool
                sink.write(orjson.dumps(record) + b"\n")
    return one, both


def test_limits_jobs_are_per_pool(tmp_path: Path) -> None:
    one, both = _two_pools(LIMITS_SLICE, tmp_path)
    single = load_jobs(one)
    double = load_jobs(both)
    assert len(double) == 2 * len(single)
    for pool in ("a", "b"):
        mine = [job for job in double if job.pool == pool]
        assert [job.job_id for job in mine] == [job.job_id for job in single]
        for got, want in zip(mine, single, strict=True):
            np.testing.assert_array_equal(got.end, want.end)
            np.testing.assert_array_equal(got.cpu_mean, want.cpu_mean)


def test_limits_sample_draws_from_every_pool_without_repeats(tmp_path: Path) -> None:
    _, both = _two_pools(LIMITS_SLICE, tmp_path)
    drawn = load_jobs(both, max_jobs=4, seed=3)  # of the six: three VMs in two pools
    keys = [(job.pool, job.job_id) for job in drawn]
    assert len(set(keys)) == 4
    # Each drawn job is one pool's series: the slice's 300 s windows, one per end.
    assert all(len(np.unique(job.end)) == len(job.end) for job in drawn)


def test_gpa_series_are_per_pool(tmp_path: Path) -> None:
    one, both = _two_pools(LIMITS_SLICE, tmp_path)
    single, double = load_usage_series(one), load_usage_series(both)
    assert len(double.names) == 2 * len(single.names)
    assert len(set(double.names)) == len(double.names)
    # Every series keeps its own length: no VM's readings doubled by its twin's.
    assert sorted(len(v) for v in double.values) == sorted(2 * [len(v) for v in single.values])


def test_gpa_aligned_rows_are_per_pool(tmp_path: Path) -> None:
    one, both = _two_pools(LIMITS_SLICE, tmp_path)
    [single] = load_aligned_windows(one, min_vms=1)
    [double] = load_aligned_windows(both, min_vms=1)
    assert len(double.names) == 2 * len(single.names)
    np.testing.assert_array_equal(double.history, np.vstack([single.history, single.history]))


def test_horizontal_apps_are_per_pool(tmp_path: Path) -> None:
    one, both = _two_pools(AZURE_SLICE, tmp_path)
    single, _ = instance_counts(one)
    double, _ = instance_counts(both)
    assert len(double) == 2 * len(single)
    # Each pool's app counts exactly the instances the slice's app ran.
    for (pool, app), series in double.items():
        assert pool in ("a", "b")
        assert series == single[("default", app)]


def test_live_relief_refuses_a_window_of_two_pools(tmp_path: Path) -> None:
    _, both = _two_pools(LIMITS_SLICE, tmp_path)
    with pytest.raises(ValueError, match=r"2 pools \(a, b\); the live relief replays one"):
        window_samples(both, 0, 1, 1)
