"""Decision quality of the default LAS and LAVA on the real Azure V1 dev split.

A change that keeps every unit test green can still cost the lifetime
policies their gain, or make them strand what Best Fit would not, and only
a replay of the real trace shows it. These tests replay two cells of the
placement matrix (``lavad evaluate placement``) under the repository's
configuration and hold the issue's goals where the defaults reach them, and
a floor under what they keep where they do not
(docs/results/placement-matrix.md has every cell over seeds 0-2):

* the tail half on memory-tight 32/128 hosts, grown pool: the cell where
  lifetimes most tempt a policy to strand capacity. Both policies keep at
  least half of the paper oracle's gain over Best Fit (LAS 71%, LAVA 58%
  as a mean over seeds 0-2) and strand no more CPU or memory than Best Fit
  + 0.25 pp (both strand less);
* the whole split on the default 48/192 hosts, grown pool: what ``lavad
  replay --compare`` on a whole period measures. There the policies keep
  41-44% of the oracle's gain (LAS and LAVA, means over seeds 0-2 and
  3-5), under the goal of half (the head half's VMs, whose lifetimes the
  trace's features tell least about, weigh on it), so the test holds the
  stranding goal and a third of the oracle's gain.

Each cell is one seed's replay, deterministic for that seed, so a figure
that moves is a change of decisions, not noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lavad.daemon.settings import load_settings
from lavad.evaluation.placement_matrix import MatrixRun, Sources, run_unit

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PAPER_ORACLE = "las-oracle:waste_guard=false;deployment_affinity=false"
POLICIES = ("bestfit", "las", "lava", PAPER_ORACLE)
# The bound: no more stranded CPU or memory than Best Fit plus this, in pp.
STRANDING_MARGIN_PP = 0.25

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]


def _cell(shared_data: Path, window: str, shape: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Each policy's figures in (window, shape, grown pool, seed 0), by policy."""
    run = MatrixRun(
        settings=load_settings(PROJECT_ROOT / "config" / "lavad.toml"),
        sources=Sources(shared_data),
        policies=POLICIES,
        fleets=("grown",),
    )
    (cell,) = run_unit(window, shape, 0, run, str(tmp_path))
    return {row["policy"]: row for row in cell["rows"]}


def _share_of_oracle(rows: dict[str, dict[str, Any]], policy: str) -> float:
    """``policy``'s gain in empty hosts over Best Fit, over the paper oracle's."""
    baseline = rows["bestfit"]["empty_pct"]
    oracle_gain = rows[PAPER_ORACLE]["empty_pct"] - baseline
    # The share means nothing where the oracle itself gains nothing: a
    # replay that made it so has lost the cell this test is about.
    assert oracle_gain > 1.0, rows
    gain: float = (rows[policy]["empty_pct"] - baseline) / oracle_gain
    return gain


def _assert_strands_no_more_than_best_fit(rows: dict[str, dict[str, Any]], policy: str) -> None:
    for resource in ("stranded_cpu_pct", "stranded_memory_pct"):
        over = rows[policy][resource] - rows["bestfit"][resource]
        assert over <= STRANDING_MARGIN_PP, (policy, resource, over, rows)


# (window, shape, the least share of the paper oracle's gain LAS and LAVA keep).
CELLS = [
    # The goal: half. Seed 0 keeps 69% (LAS) and 56% (LAVA).
    pytest.param("azure-tail", "32/128", 0.5, id="tail-32/128"),
    # Short of the goal on this data; seed 0 keeps 43% (LAS) and 38% (LAVA).
    pytest.param("azure-whole", "48/192", 1 / 3, id="whole-48/192"),
]


@pytest.mark.parametrize(("window", "shape", "least_share"), CELLS)
def test_las_and_lava_keep_the_oracles_gain_without_stranding(
    shared_data: Path, tmp_path: Path, window: str, shape: str, least_share: float
) -> None:
    rows = _cell(shared_data, window, shape, tmp_path)
    for policy in ("las", "lava"):
        share = _share_of_oracle(rows, policy)
        assert share >= least_share, (policy, share, rows)
        _assert_strands_no_more_than_best_fit(rows, policy)
