"""lavad's "ml" limits: settings read from the job's own windows, and the dominance report.

The per-job choice's step back from the rung that held is the job's own spread (the
decayed move of its window peak, relative to the VPA's limit), and its exchange rate
between slack and overruns is the VPA's own on the job; neither is a constant chosen
on one seed. The dominance report gives per pair a Student-t interval over the
(seed, half) cells.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lavad.evaluation.limits import RecommenderScore, load_jobs
from lavad.evaluation.limits_cli import app
from lavad.evaluation.limits_dominance import Cell, Interval, evaluate_cells, summarise
from lavad.models.limits.choice import ChoiceConfig, ChoiceRecommender, default_choice
from lavad.models.limits.histogram import Observation

SLICE = Path(__file__).resolve().parents[1] / "data" / "google-2011-gcd-limits-slice"


class _Fixed:
    """A candidate that keeps one limit whatever it sees (the limit can be set between windows)."""

    def __init__(self, name: str, limit: float) -> None:
        self.name = name
        self.limit: float | None = limit

    def observe(self, obs: Observation) -> None:
        pass

    def explain(self) -> dict[str, str | float | None]:
        return {"recommender": self.name}

    def on_overrun(self, time: float, limit: float) -> None:
        pass


def _obs(k: int, usage: float) -> Observation:
    return Observation(300.0 * (k + 1), (usage,), usage, usage)


def _ladder_choice(step_from_spread: bool) -> ChoiceRecommender:
    cfg = ChoiceConfig(
        d=0.1,
        probation=0.0,
        tolerance=0.0,
        w_switch=0.0,
        ladder=(0.5, 0.6, 0.7, 0.8, 0.9),
        step_back=1,
        step_from_spread=step_from_spread,
        price_rate=0.01,
        price_max=0.25,
    )
    return ChoiceRecommender([("vpa", _Fixed("vpa", 1.0))], cfg)


def test_the_step_back_is_the_jobs_own_spread_worked_by_hand() -> None:
    """Peaks alternate 0.4 / 0.6 under a VPA at 1.0: each window's peak moves 0.2 from the
    last, 0.2 of the VPA's limit. The spread (d = 0.1) after 30 windows, 29 moves:
    0.2 x (1 - 0.9^29) = 0.2 x (1 - 0.04710) = 0.19058. Rung 0.5 runs over every other
    window; 0.6 holds (a peak of 0.6 is not over 0.6) at the least slack, so it is chosen.
    One rung back would publish 0.7; the job's peak moves by 0.19 of the limit, so the
    published rung is the lowest at least 0.6 + 0.19058 = 0.79058: 0.8."""
    choice = _ladder_choice(step_from_spread=True)
    for k in range(30):
        choice.observe(_obs(k, 0.4 if k % 2 == 0 else 0.6))
    assert choice.spread == pytest.approx(0.2 * (1 - 0.9**29), rel=1e-12)
    assert choice.spread == pytest.approx(0.19058, abs=1e-5)
    assert choice.chosen == "vpax0.8" and choice.limit == pytest.approx(0.8)
    # Without the derivation, one rung back: 0.7 (what the derivation changes).
    fixed = _ladder_choice(step_from_spread=False)
    for k in range(30):
        fixed.observe(_obs(k, 0.4 if k % 2 == 0 else 0.6))
    assert fixed.chosen == "vpax0.7" and fixed.limit == pytest.approx(0.7)


def test_a_steady_job_keeps_one_rung_of_room() -> None:
    """Peaks of 0.55 that never move: spread 0, so the step back is the one rung (0.6 held,
    0.7 published), the same with or without the derivation."""
    choice = _ladder_choice(step_from_spread=True)
    for k in range(30):
        choice.observe(_obs(k, 0.55))
    assert choice.spread == 0.0
    assert choice.chosen == "vpax0.7" and choice.limit == pytest.approx(0.7)


def test_the_exchange_rate_is_the_anchors_own() -> None:
    """Usage 0.5 with a spike to 0.95 every 10th window. The VPA at 0.9 runs over at every
    spike. "tight" (0.6) runs over on the same windows (no more overruns than the VPA)
    at about 0.17 slack against the VPA's 0.44 (normal windows); "wary" sits at 0.8 and
    rises to 1.0 on the spikes: no overrun, about 0.34 slack. Both are eligible (no
    more slack, no more overruns than the VPA). In the VPA's units (its slack ~0.40,
    its overruns O): tight costs ~0.17/0.40 + 1 = 1.4, wary ~0.34/0.40 + 0 = 0.86, so
    wary is followed; by slack alone, tight."""

    def run(relative: bool) -> ChoiceRecommender:
        anchor = _Fixed("vpa", 0.9)
        tight, wary = _Fixed("tight", 0.6), _Fixed("wary", 0.8)
        cfg = ChoiceConfig(d=0.05, probation=0.0, tolerance=0.0, relative_cost=relative)
        choice = ChoiceRecommender([("vpa", anchor), ("tight", tight), ("wary", wary)], cfg)
        for k in range(200):
            spike = k % 10 == 9
            wary.limit = 1.0 if spike else 0.8
            choice.observe(_obs(k, 0.95 if spike else 0.5))
        return choice

    relative = run(relative=True)
    assert relative.overruns[1] == pytest.approx(relative.overruns[0])
    assert relative.overruns[2] == 0.0
    assert relative.slack[1] < relative.slack[2] < relative.slack[0]
    cost = [
        relative.slack[i] / relative.slack[0] + relative.overruns[i] / relative.overruns[0]
        for i in range(3)
    ]
    assert cost[2] < cost[1] < cost[0] == pytest.approx(2.0)
    assert relative.chosen == "wary"
    assert run(relative=False).chosen == "tight"


def test_default_choice_reads_the_spread_of_a_real_job() -> None:
    """On a job of the bundled Google slice, the spread ``default_choice`` keeps is the
    decayed mean of |peak - last peak| / the VPA's limit in force, recomputed here from
    the series with the VPA's limits replayed on their own."""
    [job, *_] = load_jobs(SLICE)
    choice = default_choice("cpu")
    vpa = choice.candidates[0]
    expected, last = 0.0, None
    for t, mean, peak in zip(job.end, job.cpu_mean, job.cpu_peak, strict=True):
        in_force = vpa.limit
        if last is not None and in_force is not None and in_force > 0:
            expected = 0.99 * expected + 0.01 * abs(float(peak) - last) / in_force
        last = float(peak)
        values = (float(mean), float(peak)) if peak > mean else (float(mean),)
        choice.observe(Observation(float(t), values, float(peak), float(mean)))
    assert len(job.end) > 100
    assert choice.spread > 0
    assert choice.spread == pytest.approx(expected, rel=1e-9)


def test_a_followed_anchor_is_published_as_it_is() -> None:
    """The VPA moves by one of its 5% buckets (1.0 -> 1/1.05 = 0.952, a move of 4.8% of the
    limit in force), inside the 5% deadband. Followed, its move is published: "ml" is the
    VPA wherever it has not left it. Without ``follow_anchor`` the move is held and a
    limit no candidate recommends stays in force."""

    def run(follow: bool) -> ChoiceRecommender:
        anchor = _Fixed("vpa", 1.0)
        choice = ChoiceRecommender([("vpa", anchor)], ChoiceConfig(follow_anchor=follow))
        choice.observe(_obs(0, 0.5))
        anchor.limit = 1.0 / 1.05
        choice.observe(_obs(1, 0.5))
        return choice

    followed = run(follow=True)
    assert followed.limit == pytest.approx(1.0 / 1.05) and followed.changes == 1
    held = run(follow=False)
    assert held.limit == 1.0 and held.changes == 0


def test_a_moving_window_keeps_the_spread_as_room() -> None:
    """A candidate of its own ("window", at 0.62) chosen under a VPA at 1.0, with peaks
    alternating 0.4 / 0.6 (spread 0.2 x (1 - 0.9^29) = 0.19058 after 30 windows): the
    published limit is 0.62 + 0.19058 x 1.0 = 0.81058, the room a rung keeps (no deadband
    here, so the room's growth is published window by window)."""
    anchor, window = _Fixed("vpa", 1.0), _Fixed("window", 0.62)
    cfg = ChoiceConfig(
        d=0.1,
        probation=0.0,
        tolerance=0.0,
        w_switch=0.0,
        step_from_spread=True,
        deadband=0.0,  # every move of the room is published
        change_budget=1000.0,
    )
    choice = ChoiceRecommender([("vpa", anchor), ("window", window)], cfg)
    for k in range(30):
        choice.observe(_obs(k, 0.4 if k % 2 == 0 else 0.6))
    assert choice.chosen == "window"
    assert choice.limit == pytest.approx(0.62 + 0.2 * (1 - 0.9**29), rel=1e-9)


def test_memory_never_leaves_a_vpa_that_ran_over() -> None:
    """lavad's memory default: a job whose memory ran over the VPA's limit once stays on the
    VPA for good (its rungs held on the windows since, but the job has shown it has no
    headroom to give); a job that never ran over steps down to a rung after two days."""
    day = 288

    def run(spike: bool) -> ChoiceRecommender:
        choice = default_choice("memory")
        for k in range(12 * day):
            usage = 0.9 if spike and k == day // 2 else 0.3 + 0.01 * (k % 3)
            choice.observe(_obs(k, usage))
        return choice

    steady, outgrown = run(spike=False), run(spike=True)
    assert steady.chosen is not None and steady.chosen.startswith("vpax")
    assert outgrown.chosen == "vpa"
    assert outgrown.limit == outgrown.candidates[0].limit


def _score(slack: float, overruns: float) -> RecommenderScore:
    return RecommenderScore(
        recommender="x",
        resource="cpu",
        jobs=1,
        job_days=1,
        windows=100,
        relative_slack_mean=slack,
        relative_slack_median=slack,
        demand_slack_mean=slack,
        demand_slack_median=slack,
        absolute_slack_mean=slack,
        overrun_rate=overruns,
        days_without_overrun=1.0,
        limit_changes=1,
        changes_per_job_day=1.0,
    )


def test_the_interval_over_cells_by_hand() -> None:
    """Differences -1, -2, -3 points: mean -2, sample sd 1, standard error 1/sqrt(3), the
    t quantile for 2 degrees of freedom at 97.5% 4.3027: half-width 2.4841."""
    interval = Interval.of([-0.01, -0.02, -0.03])
    assert interval.mean == pytest.approx(-0.02)
    assert interval.half_width == pytest.approx(4.302653 / math.sqrt(3) * 0.01, rel=1e-6)
    assert math.isnan(Interval.of([0.1]).half_width) and Interval.of([]).n == 0


def test_the_worst_cell_is_the_furthest_from_dominance() -> None:
    vpa = _score(0.40, 0.010)
    good = Cell("t", "cpu", 0, "first", 1, _score(0.38, 0.009), vpa, True)
    # 1% more slack is 2.5% of the VPA's; 0.001 more overruns is 10% of its.
    worse = Cell("t", "cpu", 1, "first", 1, _score(0.39, 0.011), vpa, False)
    bad = Cell("t", "cpu", 2, "second", 1, _score(0.41, 0.009), vpa, False)
    [pair] = summarise([good, worse, bad])
    assert pair.cells == 3 and pair.dominated == 1 and not pair.all_dominate
    assert pair.worst is worse
    assert pair.slack_diff.mean == pytest.approx((-0.02 - 0.01 + 0.01) / 3)
    assert np.isfinite(pair.overrun_diff.half_width)
    # Better on both counts, but 3 x the VPA's changes (the bound is 2 x): 50% past it.
    busy_ml = replace(_score(0.30, 0.005), changes_per_job_day=3.0)
    busy = Cell("t", "cpu", 3, "second", 1, busy_ml, vpa, False)
    assert busy.shortfall() == pytest.approx(0.5)
    assert summarise([good, worse, bad, busy])[0].worst is busy


def test_cells_on_the_bundled_slice_and_the_report() -> None:
    """Two seeds x both halves of the bundled slice: one cell per (resource, seed, half),
    and the command prints the per-pair summary."""
    cells = evaluate_cells(SLICE, seeds=[0, 1], max_jobs=None, warmup_s=0.0)
    assert {(c.resource, c.seed, c.part) for c in cells} == {
        (r, s, p) for r in ("cpu", "memory") for s in (0, 1) for p in ("first", "second")
    }
    result = CliRunner().invoke(
        app, ["limits", str(SLICE), "--jobs", "0", "--seeds", "0,1", "--halves", "--warmup-h", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "dominated cells" in result.output and "cells; on every cell of" in result.output
