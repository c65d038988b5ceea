"""The LAS scan's floor sets: which set and epoch a scan gets (``placement.floor_sets``)."""

from __future__ import annotations

import numpy as np
import pytest

from lavad.core.placement.floor_sets import FloorSets

A, B, C = np.zeros(3), np.zeros(3), np.zeros(3)  # equal values, three distinct arrays


@pytest.mark.parametrize(
    ("scans", "expected"),
    [
        # One array, time going on: one set, one epoch.
        ([(A, 1.0), (A, 2.0), (A, 2.0)], [(0, 1), (0, 1), (0, 1)]),
        # Time going back starts a new epoch in the same set.
        ([(A, 2.0), (A, 1.0)], [(0, 1), (0, 2)]),
        # Two arrays interleaved keep their own sets and epochs; an equal array
        # that is another object is another set (identity, not values).
        ([(A, 1.0), (B, 2.0), (A, 3.0), (B, 4.0)], [(0, 1), (1, 2), (0, 1), (1, 2)]),
        # With two sets, a third array takes the set used longest ago (A's),
        # and A back again takes B's, each in a new epoch.
        ([(A, 1.0), (B, 2.0), (C, 3.0), (A, 4.0)], [(0, 1), (1, 2), (0, 3), (1, 4)]),
        # A set returned to after other arrays, time gone back since its last
        # use: a new epoch there.
        ([(A, 5.0), (B, 6.0), (A, 4.0)], [(0, 1), (1, 2), (0, 3)]),
    ],
)
def test_a_scan_gets_its_arrays_set_and_epoch(
    scans: list[tuple[np.ndarray, float]], expected: list[tuple[int, int]]
) -> None:
    sets = FloorSets(sets=2)
    got = [sets.for_scan(thresholds, now, 4) for thresholds, now in scans]
    assert got == expected


def test_sets_grow_with_the_hosts_and_new_hosts_have_no_floor() -> None:
    sets = FloorSets(sets=3)
    index, _ = sets.for_scan(A, 0.0, 10)
    sets.floors[index, 0, :10] = 7.0
    sets.floors[index, 1, :10] = 100.0
    sets.marks[index, :, :10] = 1
    sets.for_scan(A, 1.0, 200)
    assert sets.floors.shape == (3, 2, 200)
    assert (sets.floors[index, 0, :10] == 7.0).all()  # kept through the growth
    # New hosts: epoch -1 (never current) and no exact cost.
    assert (sets.marks[:, 0, 10:] == -1).all()
    assert (sets.floors[:, 1, 10:] == -np.inf).all()


def test_no_sets_is_refused() -> None:
    with pytest.raises(ValueError, match="floor sets must be >= 1"):
        FloorSets(sets=0)


def test_absurd_times_never_continue_an_epoch_they_cannot_be_compared_with() -> None:
    """NaN starts a new epoch, and so does the first time after it; infinite and
    huge times order as any other."""
    sets = FloorSets(sets=2)
    times = [0.0, float("nan"), 5.0, 1e308, float("inf"), float("inf"), -float("inf")]
    epochs = [sets.for_scan(A, now, 4)[1] for now in times]
    assert epochs == [1, 2, 3, 3, 3, 3, 4]


def test_the_identity_cache_never_changes_which_set_a_scan_gets() -> None:
    """Its entries are only trusted when the set still holds that very array: one
    scrambled before every scan (as a restored snapshot's ids of another process
    would be) gives the same sets and epochs, and it stays bounded."""
    arrays = [np.zeros(3) for _ in range(12)]
    rng = np.random.default_rng(7)
    picks = rng.integers(0, len(arrays), size=400)
    times = np.cumsum(rng.integers(-1, 3, size=400)).astype(float)  # sometimes back
    cached, scrambled = FloorSets(sets=4), FloorSets(sets=4)
    for pick, now in zip(picks, times, strict=True):
        # Every array's id, and some that name no array, point at some set.
        scrambled.by_id = {id(a): int(rng.integers(0, 4)) for a in arrays} | {
            int(k): int(rng.integers(0, 4)) for k in rng.integers(0, 2**40, size=3)
        }
        thresholds = arrays[pick]
        assert cached.for_scan(thresholds, now, 8) == scrambled.for_scan(thresholds, now, 8)
        assert len(cached.by_id) <= 8
        assert len(scrambled.by_id) <= 8
