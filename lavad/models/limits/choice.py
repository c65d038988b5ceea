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

The limit published moves only when the chosen candidate's limit leaves a
``deadband`` around the one in force (relative), or at once upwards after
an overrun; other moves only while the changes so far stay within
``change_budget`` x (the anchor's changes + 1): Autopilot holds limits for
an hour and the VPA within bounds for the same reason, every change
restarts or resizes the task.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lavad.models.limits.histogram import Observation
from lavad.models.limits.ml import MlConfig, MlRecommender
from lavad.models.limits.vpa import VpaRecommender
from lavad.models.limits.window import (
    LimitRecommender,
    MovingWindowRecommender,
    Resource,
    WindowConfig,
)

DAY_S = 86_400.0


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
    anchor: str = "vpa"

    def __post_init__(self) -> None:
        for name in ("w_day", "w_switch", "deadband", "probation", "tolerance", "change_budget"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("d", "d_over"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")


class ChoiceRecommender:
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
        self.labels = tuple(labels)
        self.candidates = tuple(rec for _, rec in candidates)
        self._anchor = labels.index(self.config.anchor)
        count = len(self.candidates)
        self.slack = [0.0] * count
        self.overruns = [
            0.0 if index == self._anchor else self.config.probation for index in range(count)
        ]
        self._scored = [False] * count
        self._overran_on: list[int | None] = [None] * count
        self._chosen: int | None = None
        self._limit: float | None = None
        self._overran = False
        self.changes = 0
        self.anchor_changes = 0

    @property
    def limit(self) -> float | None:
        return self._limit

    @property
    def chosen(self) -> str | None:
        return None if self._chosen is None else self.labels[self._chosen]

    def observe(self, obs: Observation) -> None:
        cfg = self.config
        day = math.floor(obs.end / DAY_S)
        keep = 1.0 - cfg.d
        keep_over = 1.0 - cfg.d_over
        for index, rec in enumerate(self.candidates):
            limit = rec.limit
            if limit is not None and limit > 0:
                over = obs.peak > limit + 1e-12
                first = over and self._overran_on[index] != day
                if over:
                    self._overran_on[index] = day
                    rec.on_overrun(obs.end, limit)
                slack = (limit - min(obs.usage, limit)) / limit
                self.slack[index] = keep * self.slack[index] + cfg.d * slack
                self.overruns[index] = keep_over * self.overruns[index] + (over + cfg.w_day * first)
                self._scored[index] = True
            before = rec.limit if index == self._anchor else None
            rec.observe(obs)
            if (
                before is not None
                and rec.limit is not None
                and not math.isclose(before, rec.limit, rel_tol=1e-9)
            ):
                self.anchor_changes += 1
        self._overran = self._limit is not None and obs.peak > self._limit + 1e-12
        self._choose()

    def _choose(self) -> None:
        cfg = self.config
        ready = [i for i, rec in enumerate(self.candidates) if rec.limit is not None]
        if not ready:
            return
        anchor = self._anchor
        if self._scored[anchor] and anchor in ready:
            bar = self.overruns[anchor] + cfg.tolerance + 1e-12
            eligible = [i for i in ready if self._scored[i] and self.overruns[i] <= bar]
            best = min(eligible, key=lambda i: (self.slack[i], i != anchor, i))
            current = self._chosen
            if (
                current is not None
                and current in eligible
                and self.slack[current] <= self.slack[best] + cfg.w_switch
            ):
                best = current
        else:
            best = anchor if anchor in ready else ready[0]
        self._chosen = best
        proposed = self.candidates[best].limit
        assert proposed is not None
        held = self._limit
        if held is None:
            self._limit = proposed
            return
        # Every change restarts or resizes the task: no more of them than the
        # budget allows against the anchor's own changes, except a raise after
        # an overrun (safety comes first).
        raise_now = self._overran and proposed > held
        moves = abs(proposed - held) > cfg.deadband * held
        budget = self.changes < cfg.change_budget * (self.anchor_changes + 1)
        if raise_now or (moves and budget):
            self._limit = proposed
            self.changes += 1

    def explain(self) -> dict[str, str | float | None]:
        index = self._chosen
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


def choice_factory(
    candidates: Sequence[tuple[str, Callable[[], LimitRecommender]]],
    config: ChoiceConfig | None = None,
) -> Callable[[], ChoiceRecommender]:
    """A builder of fresh choices over fresh candidates (one per job and resource)."""

    def build() -> ChoiceRecommender:
        return ChoiceRecommender([(label, make()) for label, make in candidates], config)

    return build


def default_choice(resource: Resource, config: ChoiceConfig | None = None) -> ChoiceRecommender:
    """lavad's "ml": per job, the VPA estimator unless Autopilot's ML ensemble or one of the
    paper's moving windows has left less slack at no more overruns."""
    half_life = WindowConfig.for_resource(resource).half_life_s
    windows: list[tuple[str, LimitRecommender]] = [
        (f"window-{stat}", MovingWindowRecommender(WindowConfig(stat, half_life)))
        for stat in ("p90", "p95", "p98", "max")
    ]
    return ChoiceRecommender(
        [
            ("vpa", VpaRecommender(resource)),
            ("ml-ensemble", MlRecommender(MlConfig.for_resource(resource))),
            *windows,
        ],
        config,
    )
