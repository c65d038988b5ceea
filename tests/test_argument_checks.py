"""The shared count check: its wording is the one the constructors always used."""

from __future__ import annotations

import pytest

from lavad.core.admission.cluster import LookaheadGrid
from lavad.models.argument_checks import require_at_least
from lavad.models.limits.decision import LimitTracker


def test_counts_at_the_minimum_pass() -> None:
    require_at_least(1, rows=1, jobs=10)
    require_at_least(0, unplaced=0)


def test_the_first_count_below_the_minimum_is_named() -> None:
    with pytest.raises(ValueError, match=r"^rows must be >= 1, got 0$"):
        require_at_least(1, jobs=5, rows=0, samples=-1)


def test_a_constructor_refuses_with_its_own_argument_name() -> None:
    with pytest.raises(ValueError, match=r"^steps must be >= 1, got 0$"):
        LookaheadGrid(horizons_s=(60.0,), steps=0)
    with pytest.raises(ValueError, match=r"^max_jobs must be >= 1, got 0$"):
        LimitTracker(lambda resource: pytest.fail("no recommender is built"), max_jobs=0)
