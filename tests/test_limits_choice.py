"""lavad's "ml" limits: a per-job choice among whole recommenders, anchored on the VPA."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavad.daemon.live.state_codec import dumps, loads
from lavad.models.limits.choice import ChoiceConfig, ChoiceRecommender, default_choice
from lavad.models.limits.histogram import Observation
from lavad.models.limits.window import Resource


class _Fixed:
    """A candidate that keeps one limit whatever it sees."""

    def __init__(self, name: str, limit: float) -> None:
        self.name = name
        self.limit: float | None = limit
        self.overruns: list[float] = []

    def observe(self, obs: Observation) -> None:
        pass

    def explain(self) -> dict[str, str | float | None]:
        return {"recommender": self.name}

    def on_overrun(self, time: float, limit: float) -> None:
        self.overruns.append(time)


def _obs(k: int, usage: float) -> Observation:
    return Observation(300.0 * (k + 1), (usage,), usage, usage)


def test_follows_less_slack_at_no_more_overruns_and_falls_back_to_the_anchor() -> None:
    """Usage 0.5: the anchor at 1.0 leaves 50% slack, "tight" at 0.6 17% with no overrun, so the
    choice moves to 0.6. Usage then 0.7: "tight" overruns every window, the anchor never,
    so the choice goes back to the anchor's 1.0 (at once: it is a raise after an overrun)."""
    anchor, tight = _Fixed("vpa", 1.0), _Fixed("tight", 0.6)
    choice = ChoiceRecommender(
        [("vpa", anchor), ("tight", tight)], ChoiceConfig(d=0.1, probation=0.0)
    )
    for k in range(50):
        choice.observe(_obs(k, 0.5))
    assert choice.chosen == "tight" and choice.limit == 0.6
    assert choice.slack[1] == pytest.approx((0.6 - 0.5) / 0.6, rel=0.01)
    choice.observe(_obs(50, 0.7))
    assert tight.overruns == [300.0 * 51]  # each candidate hears of its own overruns
    assert choice.chosen == "vpa" and choice.limit == 1.0
    explained = choice.explain()
    assert explained["model"] == "vpa" and explained["recommender"] == "ml"


def test_the_deadband_holds_small_moves() -> None:
    """The only candidate moves 0.50 -> 0.54 -> 0.60: within 10% of 0.50 it is held, past it
    the published limit follows (deadband 0.1 here; 0.05 by default)."""
    only = _Fixed("vpa", 0.5)
    choice = ChoiceRecommender([("vpa", only)], ChoiceConfig(deadband=0.1))
    choice.observe(_obs(0, 0.1))
    assert choice.limit == 0.5
    only.limit = 0.54
    choice.observe(_obs(1, 0.1))
    assert choice.limit == 0.5
    only.limit = 0.6
    choice.observe(_obs(2, 0.1))
    assert choice.limit == 0.6


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="anchor"):
        ChoiceRecommender([("tight", _Fixed("tight", 1.0))])
    with pytest.raises(ValueError, match="distinct"):
        ChoiceRecommender([("vpa", _Fixed("a", 1.0)), ("vpa", _Fixed("b", 1.0))])
    with pytest.raises(ValueError, match="d must be"):
        ChoiceConfig(d=0.0)
    with pytest.raises(ValueError, match="d_over must be"):
        ChoiceConfig(d_over=2.0)
    with pytest.raises(ValueError, match="ladder"):
        ChoiceConfig(ladder=(0.9, 0.5))
    with pytest.raises(ValueError, match="ladder"):
        ChoiceConfig(ladder=(1.0,))
    with pytest.raises(ValueError, match="step_back"):
        ChoiceConfig(step_back=-1)
    with pytest.raises(ValueError, match="overrun_calm_windows"):
        ChoiceConfig(overrun_calm_windows=-2)
    with pytest.raises(ValueError, match="price_rate"):
        ChoiceConfig(price_rate=-0.1)
    with pytest.raises(ValueError, match="price_max"):
        ChoiceConfig(deadband=0.1, price_max=0.05)


def test_default_choice_runs_every_candidate() -> None:
    choice = default_choice("cpu")
    assert choice.labels[0] == "vpa" and "window-p98" in choice.labels
    assert "vpax0.9" in choice.labels
    for k in range(300):
        choice.observe(_obs(k, 0.3 + 0.2 * (k % 7 == 0)))
    assert choice.limit is not None and choice.chosen in choice.labels
    # Memory follows the VPA's own rungs only.
    assert all(label.startswith("vpa") for label in default_choice("memory").labels)


def _ladder(**config: float) -> tuple[_Fixed, ChoiceRecommender]:
    anchor = _Fixed("vpa", 1.0)
    cfg = ChoiceConfig(
        d=0.1, probation=0.0, tolerance=0.0, w_switch=0.0, ladder=(0.5, 0.7, 0.9), **config
    )
    return anchor, ChoiceRecommender([("vpa", anchor)], cfg)


def test_the_ladder_steps_down_where_the_anchor_holds_one_rung_back() -> None:
    """Usage 0.4 under an anchor at 1.0: the rungs 0.5, 0.7, 0.9 x 1.0 leave slack 0.2, 0.43,
    0.56 (the anchor 0.6) and none runs over, so the lowest rung, 0.5, is chosen and the
    one above it published (step_back 1): 0.7. A window at 0.6 runs over rung 0.5 (not
    published, scored all the same) but not the anchor, so 0.5 is out; the choice is 0.7
    and the published limit 0.9."""
    _, choice = _ladder(step_back=1)
    assert choice.labels == ("vpa", "vpax0.5", "vpax0.7", "vpax0.9")
    for k in range(20):
        choice.observe(_obs(k, 0.4))
    assert choice.chosen == "vpax0.7" and choice.limit == pytest.approx(0.7)
    choice.observe(_obs(20, 0.6))
    assert choice.overruns[1] > choice.overruns[0] == 0.0
    assert choice.chosen == "vpax0.9" and choice.limit == pytest.approx(0.9)
    assert choice.explain()["scale"] == 0.9
    # A rung follows the anchor's limit as it moves.
    anchor, choice = _ladder(step_back=0)
    choice.observe(_obs(0, 0.1))
    anchor.limit = 2.0
    assert choice.candidates[1].limit == pytest.approx(1.0)


def test_no_rung_before_min_windows_of_the_anchor() -> None:
    _, choice = _ladder(min_windows=10)
    for k in range(9):
        choice.observe(_obs(k, 0.4))
        assert choice.limit == 1.0 and choice.chosen == "vpa"
    choice.observe(_obs(9, 0.4))
    assert choice.chosen == "vpax0.5" and choice.limit == pytest.approx(0.5)


def test_a_weight_on_overruns_never_takes_more_slack_than_the_anchor() -> None:
    """Usage 0.5 with a spike to 1.05 in window 5: the anchor (1.0) and "tight" (0.9) run over
    once, "wide" (1.2) never but leaves more slack (0.58 against the anchor's 0.5), so even
    a large overrun weight keeps to "tight", which dominates the anchor on the job's past."""
    anchor, tight, wide = _Fixed("vpa", 1.0), _Fixed("tight", 0.9), _Fixed("wide", 1.2)
    cfg = ChoiceConfig(d=0.1, probation=0.0, tolerance=0.0, w_switch=0.0, overrun_weight=1e6)
    choice = ChoiceRecommender([("vpa", anchor), ("tight", tight), ("wide", wide)], cfg)
    for k in range(30):
        choice.observe(_obs(k, 1.05 if k == 5 else 0.5))
    assert choice.overruns[0] == choice.overruns[1] > choice.overruns[2] == 0.0
    assert choice.chosen == "tight" and choice.limit == 0.9


def test_changes_stay_within_the_budget_of_the_anchors() -> None:
    """An anchor that never moves and a candidate swinging 0.5 / 0.8 with less slack: the
    published limit changes at most change_budget x (anchor changes + 1) = 2 times."""
    anchor, swing = _Fixed("vpa", 1.0), _Fixed("swing", 0.8)
    choice = ChoiceRecommender(
        [("vpa", anchor), ("swing", swing)], ChoiceConfig(d=0.1, probation=0.0)
    )
    published = []
    for k in range(100):
        swing.limit = 0.8 if k % 2 else 0.5
        choice.observe(_obs(k, 0.2))
        published.append(choice.limit)
    changes = sum(1 for a, b in itertools.pairwise(published) if a != b)
    assert changes == choice.changes <= 2
    assert choice.anchor_changes == 0


def test_no_rung_within_overrun_calm_windows_of_the_anchor_running_over() -> None:
    """Usage 0.4 under an anchor at 1.0: the lowest rung, 0.5, from the first window. Window 5
    (usage 1.05) runs over the anchor and every rung alike (so the rungs stay eligible), when
    the anchor had been scored 5 windows: the choice keeps to the anchor until it has been
    scored 5 + 10 = 15 windows (k = 14), then goes back to the rung."""
    _, choice = _ladder(overrun_calm_windows=10)
    chosen = []
    for k in range(20):
        choice.observe(_obs(k, 1.05 if k == 5 else 0.4))
        chosen.append(choice.chosen)
    assert chosen == ["vpax0.5"] * 5 + ["vpa"] * 9 + ["vpax0.5"] * 6
    assert choice.overruns[1] == choice.overruns[0] > 0.0
    assert choice.limit == pytest.approx(0.5)


@pytest.mark.parametrize("resource", ["cpu", "memory"])
def test_a_restored_choice_goes_on_as_the_original(resource: Resource) -> None:
    """Snapshots save the rungs with the anchor they scale (one object, not a copy), the price
    per change and the window of the anchor's last overrun."""
    choice = default_choice(resource)
    for k in range(400):
        choice.observe(_obs(k, 0.3 + 0.4 * (k % 11 == 0)))
    restored = loads(dumps(choice))
    assert restored.candidates[-1].anchor is restored.candidates[0]
    for k in range(400, 800):
        usage = 0.2 + 0.5 * (k % 13 == 0)
        choice.observe(_obs(k, usage))
        restored.observe(_obs(k, usage))
        assert (restored.limit, restored.chosen) == (choice.limit, choice.chosen)
        assert restored.price == choice.price


class _Scripted(_Fixed):
    """A candidate whose limit moves when it learns from given windows (by index)."""

    def __init__(self, name: str, limit: float, script: dict[int, float]) -> None:
        super().__init__(name, limit)
        self.script = script
        self.seen = 0

    def observe(self, obs: Observation) -> None:
        self.limit = self.script.get(self.seen, self.limit)
        self.seen += 1


def test_no_rung_within_calm_windows_of_the_anchor_rising() -> None:
    """calm_windows 10: the choice leaves the anchor (1.0) only once it has been scored 10
    windows (k = 9), for the lowest rung (usage 0.4 under 0.5). The anchor rises to 1.2 as
    it learns window 14 (its 15th): back to it until it has 10 more, at k = 24, then the
    rung again (0.6). It falls to 1.1 at window 30: a fall does not restart the wait."""
    anchor = _Scripted("vpa", 1.0, {14: 1.2, 30: 1.1})
    cfg = ChoiceConfig(
        d=0.1, probation=0.0, tolerance=0.0, w_switch=0.0, ladder=(0.5,), calm_windows=10
    )
    choice = ChoiceRecommender([("vpa", anchor)], cfg)
    chosen = []
    for k in range(32):
        choice.observe(_obs(k, 0.4))
        chosen.append(choice.chosen)
    assert chosen == ["vpa"] * 9 + ["vpax0.5"] * 5 + ["vpa"] * 10 + ["vpax0.5"] * 8
    assert choice.limit == pytest.approx(0.55)


def test_a_price_per_change_holds_the_small_moves_past_the_budget() -> None:
    """change_budget 1 and an anchor that never moves: 1 x (0 + 1) = 1 change allowed. "swing"
    leaves less slack at no overrun and alternates 0.5 / 0.8 (a move of 0.3: 60% of 0.5,
    37.5% of 0.8). The price starts at the deadband, 0.05, and doubles (price_rate 1) per
    window while the changes run above 1, up to 0.5:

        k  changes before  price  move / limit in force  published
        0  -               0.05   (first limit)           0.5
        1  0 < 1           0.05   0.3 / 0.5 = 0.6  > 0.05 0.8
        2  1 = 1           0.05   0.3 / 0.8 = 0.375 > 0.05 0.5
        3  2 > 1           0.1    0.6 > 0.1               0.8
        4  3 > 1           0.2    0.375 > 0.2             0.5
        5  4 > 1           0.4    0.6 > 0.4               0.8
        6  5 > 1           0.5    0.375 < 0.5             0.8 (held, as from now on)

    Then the anchor moves 5 times (windows 10-14): from window 14 one change more is allowed
    (1 x (5 + 1) = 6 > 5), the price halves to 0.25 and the move to 0.5 (0.375) passes;
    at 6 = 6 the price holds and the move back (0.6) passes; at 7 > 6 it doubles to 0.5 again.
    """
    anchor = _Scripted("vpa", 1.0, {10: 1.1, 11: 1.0, 12: 1.1, 13: 1.0, 14: 1.1})
    swing = _Fixed("swing", 0.5)
    cfg = ChoiceConfig(d=0.1, probation=0.0, change_budget=1.0, price_rate=1.0, price_max=0.5)
    choice = ChoiceRecommender([("vpa", anchor), ("swing", swing)], cfg)
    published, prices = [], []
    for k in range(17):
        swing.limit = 0.8 if k % 2 else 0.5
        choice.observe(_obs(k, 0.2))
        published.append(choice.limit)
        prices.append(choice.price)
    assert published == [0.5, 0.8, 0.5, 0.8, 0.5] + [0.8] * 9 + [0.5, 0.8, 0.8]
    assert prices == pytest.approx(
        [0.05, 0.05, 0.05, 0.1, 0.2, 0.4] + [0.5] * 8 + [0.25] * 2 + [0.5]
    )
    assert choice.changes == 7 and choice.anchor_changes == 5


def test_a_raise_after_an_overrun_is_not_held_by_the_price_and_counts() -> None:
    """The price is at its top (0.5) when usage runs over "swing"'s 0.8: the anchor's 1.0 is
    published at once (a raise of 25% < 50%), and the count of changes goes up."""
    anchor, swing = _Fixed("vpa", 1.0), _Fixed("swing", 0.8)
    cfg = ChoiceConfig(d=0.1, probation=0.0, change_budget=1.0, price_rate=1.0, price_max=0.5)
    choice = ChoiceRecommender([("vpa", anchor), ("swing", swing)], cfg)
    for k in range(10):
        swing.limit = 0.8 if k % 2 else 0.5
        choice.observe(_obs(k, 0.2))
    assert choice.price == 0.5 and choice.limit == 0.8 and choice.changes == 5
    swing.limit = 0.8
    choice.observe(_obs(10, 0.9))
    assert choice.limit == 1.0 and choice.chosen == "vpa" and choice.changes == 6


@settings(max_examples=40, deadline=None)
@given(
    usage=st.lists(st.floats(0.05, 0.75), min_size=50, max_size=400),
    swings=st.lists(st.floats(0.8, 0.95), min_size=50, max_size=400),
    anchor_moves=st.lists(st.integers(0, 399), max_size=6),
)
def test_the_price_steps_with_the_budget_and_bounds_the_changes(
    usage: list[float], swings: list[float], anchor_moves: list[int]
) -> None:
    """Each window the price rises by 1 + price_rate while the changes run above the budget,
    falls while below, and stays within [deadband, price_max]. With no overrun and every
    move smaller than price_max, a job's changes pass its budget by at most the windows the
    price takes to climb from the deadband past the moves: 1 + log(0.5 / 0.05) / log(2),
    i.e. 5, here."""
    script = {k: 1.0 + 0.1 * (i % 2 == 0) for i, k in enumerate(sorted(set(anchor_moves)))}
    anchor = _Scripted("vpa", 1.0, script)
    swing = _Fixed("swing", 0.9)
    cfg = ChoiceConfig(d=0.1, probation=0.0, change_budget=1.0, price_rate=1.0, price_max=0.5)
    choice = ChoiceRecommender([("vpa", anchor), ("swing", swing)], cfg)
    for k, (use, limit) in enumerate(zip(usage, swings, strict=False)):
        swing.limit = limit
        changes, price = choice.changes, choice.price
        choice.observe(_obs(k, use))
        assert cfg.deadband <= choice.price <= cfg.price_max
        if k == 0:
            continue
        allowed = cfg.change_budget * (choice.anchor_changes + 1)
        if changes > allowed:
            assert choice.price == min(2 * price, cfg.price_max)
        elif changes < allowed:
            assert choice.price == max(price / 2, cfg.deadband)
        else:
            assert choice.price == price
        assert choice.changes <= allowed + 5
