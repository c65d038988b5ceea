"""Pool metrics against hand computations."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from lavad.core.engine import Engine, EngineConfig, HostShape, PoolSetup
from lavad.core.metrics.pool import MetricsConfig
from lavad.core.metrics.stranding import inflate
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.replay import ReplayResult, on_common_pool
from lavad.streams.schema import VmExit, VmRequest


def _engine(warmup: float, until: str) -> Engine:
    return Engine(
        EngineConfig(
            policy="firstfit",
            policy_args=validate_policy_args("firstfit", {}),
            pools=PoolSetup(HostShape(8.0, 32.0), initial_hosts=2),
            metrics=MetricsConfig(warmup_s=warmup, sample_interval_s=1_000.0, until=until),  # type: ignore[arg-type]
        )
    )


# Two 8-core hosts; the trace ends at t = 20.
#   [0, 10):  VM a (8 cores) on one host -> 1 of 2 hosts empty (50 %), CPU 8/16 = 50 %
#   [10, 15): no VMs                     -> 100 % empty, CPU 0 %
#   [15, 20): VM b (4 cores), the last request -> 50 % empty, CPU 4/16 = 25 %
@pytest.mark.parametrize(
    ("warmup", "until", "empty_pct", "cpu_pct", "seconds"),
    [
        # [0, 20]: empty (10*50 + 5*100 + 5*50)/20 = 62.5; CPU (10*50 + 5*25)/20 = 31.25
        pytest.param(0.0, "trace_end", 62.5, 31.25, 20.0, id="to-trace-end"),
        # [0, 15]: empty (10*50 + 5*100)/15 = 66.67; CPU (10*50)/15 = 33.33
        pytest.param(0.0, "last_request", 1000 / 15, 500 / 15, 15.0, id="to-last-request"),
        # [5, 20]: empty (5*50 + 5*100 + 5*50)/15 = 66.67; CPU (5*50 + 5*25)/15 = 25
        pytest.param(5.0, "trace_end", 1000 / 15, 25.0, 15.0, id="warmup-to-trace-end"),
        # [5, 15]: empty (5*50 + 5*100)/10 = 75; CPU (5*50)/10 = 25
        pytest.param(5.0, "last_request", 75.0, 25.0, 10.0, id="warmup-to-last-request"),
    ],
)
def test_time_weighted_averages(
    warmup: float, until: str, empty_pct: float, cpu_pct: float, seconds: float
) -> None:
    engine = _engine(warmup, until)
    engine.handle(VmRequest(time=0.0, pool="p", vm_id="a", cores=8.0, memory_gib=4.0), 0.0)
    engine.handle(VmExit(time=10.0, pool="p", vm_id="a"), 10.0)
    engine.handle(VmRequest(time=15.0, pool="p", vm_id="b", cores=4.0, memory_gib=4.0), 15.0)
    summary = engine.summary(20.0)["p"]
    assert summary["empty_hosts_pct"] == pytest.approx(empty_pct)
    assert summary["cpu_util_pct"] == pytest.approx(cpu_pct)
    assert summary["measured_seconds"] == pytest.approx(seconds)
    assert summary["hosts_used_peak"] == 1


@pytest.mark.parametrize(
    ("free", "shape", "left"),
    [
        # Free (3 cores, 32 GiB), mix = (2, 1) only: one copy fits -> (1, 31); nothing more fits.
        pytest.param((3.0, 32.0), (2.0, 1.0), (1.0, 31.0), id="cpu-bound"),
        # Free (8, 8), mix (2, 4): 2 fit, take half = 1 -> (6, 4);
        # then 1 fits -> (4, 0): 4 cores stranded.
        pytest.param((8.0, 8.0), (2.0, 4.0), (4.0, 0.0), id="memory-bound"),
        # Exactly divisible: free (8, 16), mix (2, 4): 4 fit -> take 2 -> (4, 8) -> take 1 -> (2, 4)
        # -> take 1 -> (0, 0): nothing stranded.
        pytest.param((8.0, 16.0), (2.0, 4.0), (0.0, 0.0), id="no-stranding"),
    ],
)
def test_inflation_single_shape(
    free: tuple[float, float], shape: tuple[float, float], left: tuple[float, float]
) -> None:
    free_arr = np.array([[free[0]], [free[1]], [0.0], [0.0]])
    shapes = np.array([[shape[0], shape[1], 0.0, 0.0]])
    result = inflate(free_arr, shapes, np.array([1.0]), np.random.default_rng(0))
    assert result[:2, 0] == pytest.approx(left)
    assert free_arr[0, 0] == free[0], "inflation must work on a copy"


def test_inflation_leaves_nothing_that_fits() -> None:
    rng = np.random.default_rng(1)
    free = np.vstack(
        [rng.uniform(0, 48, 500), rng.uniform(0, 384, 500), np.zeros(500), np.zeros(500)]
    )
    shapes = np.array([[1, 1.75, 0, 0], [2, 3.5, 0, 0], [4, 28, 0, 0], [8, 56, 0, 0]], dtype=float)
    weights = np.array([5.0, 3.0, 1.0, 1.0])
    left = inflate(free, shapes, weights, np.random.default_rng(2))
    assert np.array_equal(left, inflate(free, shapes, weights, np.random.default_rng(2)))
    assert not np.array_equal(left, inflate(free, shapes, weights, np.random.default_rng(3)))
    assert np.all(left >= -1e-9)
    for cores, memory, _, _ in shapes:
        assert not np.any((left[0] >= cores) & (left[1] >= memory))


def test_pools_grown_on_demand_compare_on_one_size() -> None:
    def run(policy: str, final: int, used_mean: float, own: float) -> ReplayResult:
        pool = {
            "hosts_added_on_demand": final,
            "hosts_up_end": final,
            "hosts_used_mean": used_mean,
            "empty_hosts_pct": own,
        }
        return ReplayResult(policy, {"p": pool}, 0, Counter(), Counter(), 0.0, 1.0)

    # Policy a needed 10 hosts and kept 5 busy on average; b needed 8, kept 4 busy.
    # On the common pool of 10: a = 100 * (1 - 5/10) = 50 %, b = 100 * (1 - 4/10) = 60 %.
    a, b = run("a", 10, 5.0, 45.0), run("b", 8, 4.0, 48.0)
    on_common_pool([a, b])
    assert a.pools["p"]["empty_hosts_pct"] == pytest.approx(50.0)
    assert b.pools["p"]["empty_hosts_pct"] == pytest.approx(60.0)
    assert b.pools["p"]["empty_hosts_pct_own_pool"] == 48.0
    assert a.pools["p"]["empty_hosts_basis"] == "common pool of 10 hosts"


def test_inflation_draws_shapes_by_their_weights() -> None:
    # 4,000 hosts with room for exactly one VM: (4 cores, 28 GiB) free.
    # Shape A (4, 7) has weight 3, shape B (4, 28) weight 1, so about 3/4 of the
    # hosts take A (21 GiB left) and 1/4 take B (0 left). Binomial sd of the
    # share: sqrt(0.75 * 0.25 / 4000) = 0.0068; allow 4 sd.
    hosts = 4_000
    free = np.vstack([np.full(hosts, 4.0), np.full(hosts, 28.0), np.zeros(hosts), np.zeros(hosts)])
    shapes = np.array([[4.0, 7.0, 0.0, 0.0], [4.0, 28.0, 0.0, 0.0]])
    left = inflate(free, shapes, np.array([3.0, 1.0]), np.random.default_rng(0))
    share_a = float(np.mean(left[1] == 21.0))
    assert share_a == pytest.approx(0.75, abs=4 * 0.0068)
    assert np.all((left[1] == 21.0) | (left[1] == 0.0))
