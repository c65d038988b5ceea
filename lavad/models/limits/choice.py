"""Per job, a choice among whole recommenders, learned online (Autopilot eq. 8-9, one level up).

Autopilot's ML recommender (``ml.py``) picks, per job, among arg-min models
that differ by a decay rate and a margin. Jobs differ more than that: a
steady service is best served by a high percentile held still (the VPA's
way), a job that swings by a moving window, an erratic one by the ensemble.
``ChoiceRecommender`` runs several recommenders side by side on the same
windows and learns, per job, which to follow. For the limit each candidate r
had *in force* during a window (chosen before seeing it) it keeps

- the decayed mean (rate ``d`` per window) of its relative slack
  ``(L - min(usage, L)) / L``, Autopilot's slack on the usage the limit
  lets through, and
- the decayed sum (rate ``d_over``, slower: overruns are rare, memory
  overruns rarer, and one must not be forgotten within hours) of its
  overrun cost ``over + w_day first``: 1 if the window's peak ran over L,
  plus ``w_day`` if that was r's first overrun of the calendar day (the
  evaluation counts clean job-days, so a day's first overrun costs more
  than its second).

One candidate is the *anchor* (the VPA estimator by default: the baseline
lavad's limits must beat). The choice is the candidate with the least slack
among those whose overrun cost is within ``tolerance`` of the anchor's: per
job, the anchor unless another has left less slack at no more overruns, so
what is chosen dominates the anchor on the job's own recent past. Every
other candidate starts on probation, as if it had overrun once
(``probation``): a tighter limit must first show it holds (a memory
overrun is rare and kills, and each candidate overrunning once before it
is excluded would add up). It switches only
for ``w_switch`` less slack, or when the one followed overruns more than the
anchor.

The VPA's own limit scaled down (a *ladder* of rungs, ``factor`` x the
anchor's limit) is a candidate family of its own: where a job's history
shows a lower rung held at no more overruns than the anchor (an overrun
costs as above), the rung leaves less slack on both counts. What is
resolved on the past overruns more on the future (the lowest rung that
held is the one that was closest to running over), so a choice of rung
``k`` publishes rung ``k + step_back``, nearer the anchor, or with
``step_from_spread`` the first rung at least the job's own spread (the
decayed move of its peak from window to window, relative to the anchor's
limit) above rung ``k`` (a moving window chosen keeps the same room); and the anchor
is not left before it has been scored ``min_windows`` windows, nor within
``calm_windows`` of its limit rising, nor within ``overrun_calm_windows`` of
its own limit running over.

The limit published moves only when the chosen candidate's limit leaves a
``deadband`` around the one in force (relative), or at once upwards after
an overrun. Every change restarts or resizes the task (Autopilot holds
limits for an hour and the VPA within bounds for the same reason), so the
changes are held to ``change_budget`` x (the anchor's changes + 1), in one
of two ways:

- a hard budget (``price_rate`` 0): past it, only raises after an overrun;
  first come, first served, so a raise can hold a limit up for the rest of
  the job's life;
- a price per change (``price_rate`` > 0), a dual variable per job. A move
  from the limit in force ``H`` to ``P`` saves about ``|H - P| / H`` of the
  limit per window (slack on a lowering, the room that was short on a
  raise) over the windows it holds; taking that hold as the same for every
  move of the job, a move is worth a change when ``|H - P| / H`` exceeds
  the price (the price per change over the hold). The price starts at the
  deadband; each window it is multiplied by ``1 + price_rate`` while the
  changes run above the budget and divided by it while below, within
  ``[deadband, price_max]``. The budget is then spent on the largest moves
  rather than the first ones, and a lowering after a raise passes if it is
  worth the price. Raises after an overrun still go through at once (safety
  first) and count against the budget, raising the price for the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from lavad.models.limits.histogram import INTERVAL_S, BucketScheme, Observation
from lavad.models.limits.vpa import MEMORY_AGGREGATION_S, VPA_HALF_LIFE_S, VpaRecommender
from lavad.models.limits.window import (
    HeldLimit,
    LimitRecommender,
    MovingWindowRecommender,
    Resource,
    WindowConfig,
    WindowSignal,
)

DAY_S = 86_400.0
# ``overrun_calm_windows`` for "never again" (more windows than any job has).
NEVER: Final = 2**62


@dataclass(frozen=True, slots=True)
class ChoiceConfig:
    """Smoothing per window, the day's-first-overrun weight, switch penalty, deadband, anchor."""

    d: float = 0.01
    d_over: float = 0.001
    w_day: float = 2.0
    w_switch: float = 0.02
    # A candidate other than the anchor starts as if it had overrun once
    # (on probation), and is eligible while its overrun cost is within
    # ``tolerance`` of the anchor's.
    probation: float = 3.0
    tolerance: float = 0.5
    # The live tracker's tolerance: a move within it is not a decision either.
    deadband: float = 0.05
    # At most this many limit changes per change of the anchor (plus one).
    change_budget: float = 2.0
    # 0: the budget is hard (past it, a move waits). > 0: the budget has a
    # price per job, the least relative move worth a change, multiplied by
    # 1 + price_rate per window while the changes run above the budget and
    # divided by it while below, within [deadband, price_max].
    price_rate: float = 0.0
    price_max: float = 1.0
    anchor: str = "vpa"
    # Rungs of the ladder, ascending fractions of the anchor's limit (< 1).
    ladder: tuple[float, ...] = ()
    # A chosen rung publishes the rung this many steps nearer the anchor.
    step_back: int = 0
    # Anchor windows scored before the choice may leave the anchor.
    min_windows: int = 0
    # Windows since the anchor's limit last rose before the choice may leave
    # it (a rising VPA is a job still growing).
    calm_windows: int = 0
    # Windows since the anchor's own limit last ran over before the choice may
    # leave it (-1: no wait).
    overrun_calm_windows: int = -1
    # Among the candidates at most as bad as the anchor on both counts, the
    # one with least slack + ``overrun_weight`` x its decayed overrun cost per
    # window (0: least slack).
    overrun_weight: float = 0.0
    # Instead of a weight: each candidate's slack and overruns in units of the
    # anchor's own on this job (slack / anchor's slack + overruns / anchor's
    # overruns), i.e. a weight that is the job's own exchange rate, the
    # anchor's slack per overrun per window (see ``default_config``).
    relative_cost: bool = False
    # A chosen rung publishes the lowest rung (or the anchor) at least the
    # job's spread above it, and at least ``step_back`` rungs: the spread is the
    # decayed mean (rate ``d``) of the move of the window's peak from the last
    # window's, as a fraction of the anchor's limit in force.
    step_from_spread: bool = False
    # Where the anchor is followed, its limit is published whatever the
    # price (its own moves and the move back to it).
    follow_anchor: bool = False

    def __post_init__(self) -> None:
        for name in (
            "w_day",
            "w_switch",
            "deadband",
            "probation",
            "tolerance",
            "change_budget",
            "overrun_weight",
            "price_rate",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("d", "d_over"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        if not (math.isfinite(self.price_max) and self.price_max >= self.deadband):
            raise ValueError(f"price_max must be finite and >= deadband, got {self.price_max!r}")
        if any(not (math.isfinite(f) and 0 < f < 1) for f in self.ladder):
            raise ValueError(f"ladder rungs must be in (0, 1), got {self.ladder!r}")
        if list(self.ladder) != sorted(set(self.ladder)):
            raise ValueError(f"ladder rungs must be distinct and ascending, got {self.ladder!r}")
        for name in ("step_back", "min_windows", "calm_windows"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.overrun_calm_windows < -1:
            got = self.overrun_calm_windows
            raise ValueError(f"overrun_calm_windows must be >= 0 or -1 (no wait), got {got!r}")


class AnchorRung:
    """``factor`` x the anchor's limit: a rung of the ladder (it learns nothing itself)."""

    def __init__(self, anchor: LimitRecommender, factor: float) -> None:
        self.anchor = anchor
        self.factor = factor
        self.name = f"{anchor.name}x{factor:g}"

    def observe(self, obs: Observation) -> None:
        """The anchor learns from the window; the rung follows its limit."""

    @property
    def limit(self) -> float | None:
        limit = self.anchor.limit
        return None if limit is None else limit * self.factor

    def explain(self) -> dict[str, str | float | None]:
        return {**self.anchor.explain(), "scale": self.factor}

    def on_overrun(self, time: float, limit: float) -> None:
        """The anchor hears only of its own overruns (VPA's OOM bump is for its limit)."""


class ChoiceRecommender(HeldLimit):
    """Follows, per job, the candidate with least slack at no more overruns than the anchor."""

    def __init__(
        self,
        candidates: Sequence[tuple[str, LimitRecommender]],
        config: ChoiceConfig | None = None,
        name: str = "ml",
    ) -> None:
        if not candidates:
            raise ValueError("a choice needs at least one candidate recommender")
        labels = [label for label, _ in candidates]
        if len(set(labels)) != len(labels):
            raise ValueError(f"candidate names must be distinct, got {labels}")
        self.name = name
        self.config = config or ChoiceConfig()
        if self.config.anchor not in labels:
            raise ValueError(f"the anchor {self.config.anchor!r} is not a candidate: {labels}")
        self._anchor = labels.index(self.config.anchor)
        anchor_rec = candidates[self._anchor][1]
        rungs = [AnchorRung(anchor_rec, f) for f in self.config.ladder]
        self.labels = (*labels, *(rung.name for rung in rungs))
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"candidate names clash with the ladder's: {self.labels}")
        self.candidates: tuple[LimitRecommender, ...] = (
            *(rec for _, rec in candidates),
            *rungs,
        )
        # Candidate index of each rung, lowest first; then the anchor.
        self._ladder = (*range(len(labels), len(self.labels)), self._anchor)
        self.anchor_windows = 0
        self._anchor_rose_at = 0
        self._anchor_overran_at: int | None = None
        count = len(self.candidates)
        self.slack = [0.0] * count
        self.overruns = [
            0.0 if index == self._anchor else self.config.probation for index in range(count)
        ]
        self._scored = [False] * count
        self._overran_on: list[int | None] = [None] * count
        self._chosen: int | None = None
        # The candidate whose limit is published (the chosen one, or a rung
        # nearer the anchor than the chosen rung).
        self._followed: int | None = None
        self._limit: float | None = None
        self._overran = False
        self.changes = 0
        self.anchor_changes = 0
        # The least relative move worth a change (the price per change).
        self.price = self.config.deadband
        # The job's spread: decayed mean of |peak - last peak| / the anchor's
        # limit in force; and the last window's peak.
        self.spread = 0.0
        self._last_peak: float | None = None

    @property
    def chosen(self) -> str | None:
        return None if self._followed is None else self.labels[self._followed]

    @property
    def _learners(self) -> int:
        """How many candidates learn: the rungs, after them, learn nothing and hear of
        no overrun."""
        return len(self.candidates) - len(self.config.ladder)

    def _limits(self) -> list[float | None]:
        """Every candidate's limit now: a rung's is ``AnchorRung.limit``, the anchor's
        times the rung's factor, taken at once rather than through a call per rung."""
        candidates = self.candidates
        limits = [candidates[index].limit for index in range(self._learners)]
        anchor = limits[self._anchor]
        ladder = self.config.ladder
        if anchor is None:
            limits.extend(None for _ in ladder)
        else:
            limits.extend(anchor * factor for factor in ladder)
        return limits

    def observe(self, obs: Observation) -> None:
        cfg = self.config
        day = math.floor(obs.end / DAY_S)
        d, d_over, w_day = cfg.d, cfg.d_over, cfg.w_day
        keep = 1.0 - d
        keep_over = 1.0 - d_over
        peak, usage, end = obs.peak, obs.usage, obs.end
        anchor = self._anchor
        learners = self._learners
        candidates = self.candidates
        slacks, overruns = self.slack, self.overruns
        scored, overran_on = self._scored, self._overran_on
        # Every limit in force is read before any candidate learns from the
        # window (a rung's limit moves with the anchor's).
        limits = self._limits()
        in_force = limits[anchor]
        if self._last_peak is not None and in_force is not None and in_force > 0:
            move = abs(peak - self._last_peak) / in_force
            self.spread = keep * self.spread + d * move
        self._last_peak = peak
        for index, limit in enumerate(limits):
            if limit is not None and limit > 0:
                over = peak > limit + 1e-12
                first = over and overran_on[index] != day
                if over:
                    overran_on[index] = day
                    if index < learners:
                        candidates[index].on_overrun(end, limit)
                    if index == anchor:
                        self._anchor_overran_at = self.anchor_windows
                slack = (limit - min(usage, limit)) / limit
                slacks[index] = keep * slacks[index] + d * slack
                overruns[index] = keep_over * overruns[index] + (over + w_day * first)
                scored[index] = True
                if index == anchor:
                    self.anchor_windows += 1
        for index in range(learners):
            rec = candidates[index]
            before = limits[index] if index == anchor else None
            rec.observe(obs)
            if (
                before is not None
                and rec.limit is not None
                and not math.isclose(before, rec.limit, rel_tol=1e-9)
            ):
                self.anchor_changes += 1
                if rec.limit > before:
                    self._anchor_rose_at = self.anchor_windows
        self._overran = self._limit is not None and peak > self._limit + 1e-12
        self._choose(self._limits())

    def _choose(self, limits: list[float | None]) -> None:
        """Choose and publish by the candidates' limits after the window (``_limits``)."""
        cfg = self.config
        ready = [i for i, limit in enumerate(limits) if limit is not None]
        if not ready:
            return
        anchor = self._anchor
        calm = self.anchor_windows - self._anchor_rose_at >= cfg.calm_windows and (
            cfg.overrun_calm_windows < 0
            or self._anchor_overran_at is None
            or self.anchor_windows - self._anchor_overran_at >= cfg.overrun_calm_windows
        )
        if (
            self._scored[anchor]
            and anchor in ready
            and self.anchor_windows >= cfg.min_windows
            and calm
        ):
            bar = self.overruns[anchor] + cfg.tolerance + 1e-12
            eligible = [i for i in ready if self._scored[i] and self.overruns[i] <= bar]
            per_window = 0.0
            slack_unit = overrun_unit = 1.0
            if cfg.relative_cost:
                # Dominance on the job's past, then each count in units of the
                # anchor's own (a count the anchor has none of is 0 for every
                # eligible candidate too, and adds nothing).
                most = self.slack[anchor] + 1e-12
                eligible = [i for i in eligible if self.slack[i] <= most]
                slack_unit = self.slack[anchor] if self.slack[anchor] > 0 else math.inf
                overrun_unit = self.overruns[anchor] if self.overruns[anchor] > 0 else math.inf
                per_window = 1.0 / overrun_unit
            elif cfg.overrun_weight > 0:
                # Dominance on the job's past: no more slack than the anchor
                # either; then the cost, overruns per window the decayed
                # sums cover ((1 - (1 - d_over)^n) / d_over of n windows).
                most = self.slack[anchor] + 1e-12
                eligible = [i for i in eligible if self.slack[i] <= most]
                covered = (1.0 - (1.0 - cfg.d_over) ** self.anchor_windows) / cfg.d_over
                per_window = cfg.overrun_weight / max(covered, 1.0)

            def cost(i: int) -> float:
                return self.slack[i] / slack_unit + per_window * self.overruns[i]

            best = min(eligible, key=lambda i: (cost(i), i != anchor, i))
            current = self._chosen
            if (
                current is not None
                and current in eligible
                and cost(current) <= cost(best) + cfg.w_switch
            ):
                best = current
        else:
            best = anchor if anchor in ready else ready[0]
        self._chosen = best
        if best in self._ladder:
            best = self._ladder[self._step_back(self._ladder.index(best))]
        self._followed = best
        proposed = limits[best]
        assert proposed is not None
        if cfg.step_from_spread and best not in self._ladder:
            # A candidate of its own (a moving window) keeps the same room over
            # what held as a rung does: the job's spread, in the anchor's
            # limit; never past the anchor from below.
            ceiling = limits[anchor]
            if ceiling is not None:
                room = proposed + self.spread * ceiling
                proposed = room if proposed > ceiling else min(room, ceiling)
        held = self._limit
        if held is None:
            self._limit = proposed
            return
        # Every change restarts or resizes the task: no more of them than the
        # budget allows against the anchor's own changes, except a raise after
        # an overrun (safety comes first).
        worth = self._worth_a_change(abs(proposed - held), held)
        # Where the anchor is followed, its limit is published as it is: "ml"
        # is the VPA wherever it has not left it. A move to the anchor held by
        # the price would keep a limit no candidate chose (a rung's or a moving
        # window's, stale), trading along the VPA's own line.
        follows = (
            cfg.follow_anchor and best == anchor and not math.isclose(proposed, held, rel_tol=1e-9)
        )
        if worth or follows or (self._overran and proposed > held):
            self._limit = proposed
            self.changes += 1

    def _step_back(self, rung: int) -> int:
        """The rung published for the chosen ``rung`` (index in the ladder, the anchor last).

        ``step_back`` rungs up; with ``step_from_spread``, further up until the
        rung's factor is at least the chosen one's plus the job's spread: the
        chosen rung held on the windows seen, the next window's peak moves from
        the last by about the spread, so that is the room the published rung
        keeps over the one that held.
        """
        cfg = self.config
        top = len(self._ladder) - 1
        published = min(rung + cfg.step_back, top)
        if cfg.step_from_spread:
            factors = (*cfg.ladder, 1.0)
            target = factors[rung] + self.spread - 1e-12
            while published < top and factors[published] < target:
                published += 1
        return published

    def _worth_a_change(self, move: float, held: float) -> bool:
        """Whether moving the limit in force ``held`` by ``move`` is worth one of the job's changes.

        With a price, the price first takes this window's step (the caller
        asks once per window).
        """
        cfg = self.config
        allowed = cfg.change_budget * (self.anchor_changes + 1)
        if cfg.price_rate == 0:
            return move > cfg.deadband * held and self.changes < allowed
        if self.changes > allowed:
            self.price = min(self.price * (1.0 + cfg.price_rate), cfg.price_max)
        elif self.changes < allowed:
            self.price = max(self.price / (1.0 + cfg.price_rate), cfg.deadband)
        return move > self.price * held

    def explain(self) -> dict[str, str | float | None]:
        index = self._followed
        inner = {} if index is None else self.candidates[index].explain()
        return {
            **inner,
            "recommender": self.name,
            # The candidate followed, and its own model if it has one (the ensemble's).
            "model": None
            if index is None
            else ":".join(str(part) for part in (self.labels[index], inner.get("model")) if part),
            "model_slack": None if index is None else self.slack[index],
            "model_overruns": None if index is None else self.overruns[index],
            "anchor_overruns": self.overruns[self._anchor],
        }

    def on_overrun(self, time: float, limit: float) -> None:
        """Each candidate hears of overruns of its own limits in ``observe``."""


# Rungs of the VPA's limit a job may step down to: a grid at the deadband's
# spacing (two rungs closer than the deadband are one limit to the change
# rule), down to half the VPA's limit. Which rung a job publishes is its own
# (see ``default_config``); the grid is only the resolution.
DEFAULT_LADDER: Final = tuple(round(1.0 - 0.05 * k, 2) for k in range(10, 0, -1))
# Windows of the VPA's memory aggregation (a histogram of daily peaks).
MEMORY_AGGREGATION_WINDOWS: Final = round(MEMORY_AGGREGATION_S / INTERVAL_S)
# Windows of the VPA's half-life (its histograms' decay).
VPA_HALF_LIFE_WINDOWS: Final = round(VPA_HALF_LIFE_S / INTERVAL_S)


def default_config(resource: Resource) -> ChoiceConfig:
    """lavad's "ml" settings, the same on every trace; what differs per job is read from
    the job's own windows.

    No probation and no tolerance: a candidate is followed only where it has
    left less slack than the VPA at no more overruns (both resolved on the
    job's own windows). Among those, the one with the least slack + overruns,
    each in units of the VPA's own on the job (``relative_cost``): the
    exchange rate between a point of slack and an overrun is the job's, the
    VPA's slack per overrun (a job that runs over the VPA in 8% of its windows
    at 48% slack trades about 6 points of slack for a point of overruns, one
    at 0.05% and 70% about 1,400), where a single weight (20, chosen on one
    seed) made every job trade at the rate of the trace it was chosen on.

    The chosen rung publishes the rung above it or higher, by the job's own
    spread (``step_from_spread``): the decayed mean move of its window peak
    from one window to the next, as a fraction of the VPA's limit. What held
    on the past runs over more on the future by about that move; a steady
    job keeps one rung of room (5%), a job whose peak jumps by 20% of the
    limit from window to window keeps 20%. The ladder itself is a grid at the
    deadband's spacing down to half the VPA's limit.

    Where the VPA is the choice, its limit is published as it is
    (``follow_anchor``): a move back to it, or a move of its own, held by the
    price would leave in force a limit no candidate chose.

    A job leaves the VPA only once the VPA has weighed a day of it: CPU after
    one of the VPA's half-lives (its CPU histogram decays by half in a day), so
    the comparison covers the job's daily cycle (with none, a moving window
    that had no overrun in the first hours of a job is followed into the
    day's peak); memory after two of its aggregation windows (its memory
    estimate is a histogram of daily peaks: one day of history does not yet
    show a day-to-day spread), and not within one of its limit rising (a job
    still growing). Memory never leaves the VPA after the VPA's own limit ran
    over: a job that has outgrown the VPA's estimate once has shown it has no
    headroom to give (a week's wait instead let a job's new high, 1.5% above
    any peak of the 9 days before, OOM under a rung; "never" needs no length
    of wait chosen on a trace).

    Changes have a price (see the module's docstring), with the budget at
    the anchor's changes + 1, half the evaluation's bound of 2 x the VPA's:
    the price lets the count run past its budget (raises after an overrun
    are never held, and a move larger than the price passes). The price
    starts at the 5% deadband and moves by 1% a window (a factor of about
    18 a day), up to 25%: past its budget a job moves only by a quarter of
    its limit or more.
    """
    return ChoiceConfig(
        w_switch=0.0,
        probation=0.0,
        tolerance=0.0,
        ladder=DEFAULT_LADDER,
        step_back=1,
        relative_cost=True,
        step_from_spread=True,
        follow_anchor=True,
        change_budget=1.0,
        price_rate=0.01,
        price_max=0.25,
        min_windows=VPA_HALF_LIFE_WINDOWS if resource == "cpu" else 2 * MEMORY_AGGREGATION_WINDOWS,
        calm_windows=0 if resource == "cpu" else MEMORY_AGGREGATION_WINDOWS,
        overrun_calm_windows=-1 if resource == "cpu" else NEVER,
    )


def default_choice(resource: Resource, config: ChoiceConfig | None = None) -> ChoiceRecommender:
    """lavad's "ml": per job, the VPA unless a lower rung of its own limit or (CPU) one of
    Autopilot's moving windows has left less slack at no more overruns.

    Memory follows the VPA's rungs only: the moving windows follow memory
    down faster than it grows back, and each of their first overruns is an
    OOM.
    """
    half_life = WindowConfig.for_resource(resource).half_life_s
    windows: list[tuple[str, LimitRecommender]] = []
    if resource == "cpu":
        # One signal for the three: they differ only in the statistic they take of it.
        configs = [WindowConfig(stat, half_life) for stat in ("p95", "p98", "max")]
        signal = WindowSignal(BucketScheme.default(), half_life, configs[0].peak_samples)
        windows = [
            (f"window-{config.statistic}", MovingWindowRecommender(config, signal=signal))
            for config in configs
        ]
    return ChoiceRecommender(
        [("vpa", VpaRecommender(resource)), *windows],
        config or default_config(resource),
    )
