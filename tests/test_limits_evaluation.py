"""The limits evaluation: metrics by hand, then the whole pipeline on real traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lavad.evaluation.limits import (
    JobSeries,
    RecommenderScore,
    default_recommenders,
    dominates,
    evaluate_jobs,
    evaluate_limits,
    load_jobs,
    plot_pareto,
    replay_job,
    score,
    trace_half,
)
from lavad.evaluation.limits_cli import app
from lavad.models.limits import BucketScheme, MovingWindowRecommender, WindowConfig
from lavad.models.limits.histogram import Observation

SLICE = Path(__file__).resolve().parents[1] / "data" / "google-2011-gcd-limits-slice"


def test_metrics_by_hand() -> None:
    # Running max of the past (margin 0, no hold): 0.5 for a while, one spike to 1.0.
    rec = MovingWindowRecommender(
        WindowConfig("max", margin=0.0, hold_s=0.0, peak_samples=1000),
        BucketScheme.linear(2.0, 0.25),
    )
    values = np.array([0.5] * 12 + [1.0] + [0.5] * 11)
    end = 300.0 * np.arange(1, 25)
    days = replay_job(rec, end, values, values, warmup_s=0.0)
    s = score("max", "cpu", 1, days)
    # Scored: windows 2..24 (the first has no limit yet): 23 windows, one day.
    assert (s.job_days, s.windows) == (1, 23)
    mean_limit = (12 * 0.5 + 11 * 1.0) / 23
    assert s.relative_slack_mean == pytest.approx((mean_limit - 0.5) / mean_limit)
    # The p95 of the demand is 0.5 too (one spike in 23 windows).
    assert s.demand_slack_mean == pytest.approx(s.relative_slack_mean)
    # The spike was throttled to its limit: that window had no slack (not -0.5).
    assert s.absolute_slack_mean == pytest.approx(11 * 0.5 / 23)
    assert s.overrun_rate == pytest.approx(1 / 23)  # the spike ran over 0.5
    assert s.days_without_overrun == 0.0
    assert s.limit_changes == 1


def test_dominance() -> None:
    def sc(slack: float, over: float) -> RecommenderScore:
        return RecommenderScore(
            "x", "cpu", 1, 1, 1, slack, slack, slack, slack, 0.0, over, 1.0, 0, 0.0
        )

    assert dominates(sc(0.1, 0.01), sc(0.2, 0.01))
    assert dominates(sc(0.2, 0.005), sc(0.2, 0.01))
    assert not dominates(sc(0.1, 0.02), sc(0.2, 0.01))
    assert not dominates(sc(0.2, 0.01), sc(0.2, 0.01))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_jobs"):
        load_jobs(SLICE, max_jobs=0)
    with pytest.raises(ValueError, match="warmup_s"):
        evaluate_jobs([], {}, warmup_s=-1.0)


def test_pipeline_on_the_bundled_real_slice(tmp_path: Path) -> None:
    jobs = load_jobs(SLICE, max_jobs=3, seed=0)
    assert len(jobs) == 3
    assert all(j.memory is not None and len(j.end) == 576 for j in jobs)
    scores = evaluate_jobs(jobs, default_recommenders())
    names = {s.recommender for s in scores}
    assert {"ml", "vpa", "window-p95", "window-avg"} <= names
    assert {s.resource for s in scores} == {"cpu", "memory"}
    # Every recommender is scored on the same job-days and windows.
    assert len({(s.resource, s.job_days, s.windows) for s in scores}) == 2
    for s in scores:
        assert 0.0 <= s.overrun_rate <= 1.0
        assert 0.0 <= s.days_without_overrun <= 1.0
        assert s.relative_slack_mean < 1.0
    by = {(s.resource, s.recommender): s for s in scores}
    # Average usage as a CPU limit is throttled far more often than its 98th percentile.
    assert by["cpu", "window-avg"].overrun_rate > by["cpu", "window-p98"].overrun_rate


def test_cli_writes_table_json_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "pareto.png"
    out = tmp_path / "limits.json"
    result = CliRunner().invoke(
        app, ["limits", str(SLICE), "--jobs", "2", "--plot", str(png), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "ML" in result.output and "VPA" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b'"recommender": "vpa"' in out.read_bytes()


def test_cli_refuses_a_trace_with_no_job_rather_than_print_an_empty_table(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    result = CliRunner().invoke(app, ["limits", str(empty)])
    assert result.exit_code != 0
    assert "holds no job with usage samples" in " ".join(result.output.split())


@pytest.mark.shared_data
@pytest.mark.slow
def test_planetlab_cpu_only(shared_data: Path, tmp_path: Path) -> None:
    ev = evaluate_limits(shared_data / "planetlab", max_jobs=2, seed=0)
    assert {s.resource for s in ev.scores} == {"cpu"}
    plot_pareto([ev], tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_a_known_maximum_joins_the_mean_in_the_histogram() -> None:
    # Azure V1 CPU gives each interval's mean and maximum: both are samples.
    rec = MovingWindowRecommender(
        WindowConfig("max", margin=0.0, hold_s=0.0), BucketScheme.linear(2.0, 0.25)
    )
    replay_job(rec, np.array([300.0]), np.array([0.5]), np.array([1.0]), warmup_s=0.0)
    assert rec.peak() == 1.0
    assert rec.average() == 0.75  # the window's histogram mean: (0.5 + 1.0) / 2


def test_sweep_command_on_the_slice() -> None:
    result = CliRunner().invoke(
        app,
        [
            "limits-sweep",
            str(SLICE),
            "--resource",
            "memory",
            "--w-u",
            "0.01",
            "--train",
            "2",
            "--jobs",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "VPA" in result.output and "0.01" in result.output


class _FixedLimit:
    """A recommender that keeps one limit whatever it sees."""

    name = "fixed"

    def __init__(self, limit: float) -> None:
        self.limit = limit

    def observe(self, obs: Observation) -> None:
        pass

    def explain(self) -> dict[str, str | float | None]:
        return {"limit": self.limit}

    def on_overrun(self, time: float, limit: float) -> None:
        pass


def test_autopilot_slack_is_against_the_usage_the_limit_let_through() -> None:
    """A limit held at 0.4 under a job asking for 0.5 in 12 of 24 windows and 0.2 in the rest:
    the demand slack is (0.4 - 0.5) / 0.4 = -25%; Autopilot's, on the throttled usage (p95
    0.4), is 0; absolute slack counts the 0.2 windows only."""
    values = np.array([0.5, 0.2] * 12)
    end = 300.0 * np.arange(1, 25)
    days = replay_job(_FixedLimit(0.4), end, values, values, warmup_s=0.0)
    s = score("fixed", "cpu", 1, days)
    assert s.demand_slack_mean == pytest.approx(-0.25)
    assert s.relative_slack_mean == pytest.approx(0.0)
    assert s.absolute_slack_mean == pytest.approx(12 * 0.2 / 24)
    assert s.overrun_rate == pytest.approx(0.5)


def test_domination_can_require_changes_within_a_ratio() -> None:
    def sc(slack: float, over: float, changes: float) -> RecommenderScore:
        return RecommenderScore(
            "x", "cpu", 1, 1, 1, slack, slack, slack, slack, 0.0, over, 1.0, 0, changes
        )

    fewer, vpa = sc(0.1, 0.01, 2.0), sc(0.2, 0.01, 1.0)
    assert dominates(fewer, vpa, change_ratio=2.0)
    assert not dominates(sc(0.1, 0.01, 2.1), vpa, change_ratio=2.0)
    assert dominates(sc(0.1, 0.01, 2.1), vpa)


def test_each_half_keeps_each_jobs_windows_on_its_side_of_the_middle_day() -> None:
    """Two jobs over 3.5 days: the middle rounds to 2 days after the first window's end."""
    day = 86_400.0
    ends = np.arange(1, 1 + 7 * 72) * 600.0  # 600 s windows over 3.5 days
    one = JobSeries("p", "a", ends, ends * 0 + 0.1, ends * 0 + 0.2, None)
    tail = ends[ends > 3 * day]
    late = JobSeries("p", "b", tail, tail * 0 + 0.3, tail * 0 + 0.4, None)
    middle = ends[0] + 2 * day
    first, second = trace_half([one, late], "first"), trace_half([one, late], "second")
    assert [job.job_id for job in first] == ["a"]
    assert [job.job_id for job in second] == ["a", "b"]
    assert first[0].end.max() <= middle < second[0].end.min()
    assert len(first[0].end) + len(second[0].end) == len(ends)
    assert trace_half([one, late], "whole") == [one, late]
    with pytest.raises(ValueError, match="part"):
        trace_half([one], "both")
