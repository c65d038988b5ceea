"""The collector's schedule (``lavad.daemon.heap``): what each settle scans and frees."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from lavad.daemon import heap


class _Node:
    """A weak-referenceable object that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """Two objects referring to each other, reachable from nowhere else: only the
    cyclic collector frees them. Returns a weak reference to one of them."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def _unfrozen_after() -> Iterator[None]:
    """The tests freeze the heap; the rest of the session runs with CPython's view."""
    yield
    gc.unfreeze()


def test_settle_new_collects_new_garbage_and_freezes_what_survived() -> None:
    heap.settle()
    frozen = gc.get_freeze_count()
    kept = [_Node() for _ in range(1_000)]  # the restored state
    garbage = _cycle()
    heap.settle_new()
    assert garbage() is None, "a cycle made since the last freeze is collected"
    # The new state joined the frozen objects (which the collector no longer
    # lists); nothing frozen before was let go.
    assert gc.get_freeze_count() >= frozen + len(kept)
    listed = {id(item) for item in gc.get_objects()}
    assert not any(id(node) in listed for node in kept)


def test_settle_new_leaves_frozen_garbage_for_the_next_full_settle() -> None:
    garbage = _cycle()
    heap.settle()
    assert garbage() is None, "a full settle collects a cycle before freezing"
    frozen_garbage = _cycle()
    gc.freeze()  # as if it had been part of the state frozen at the last settle
    heap.settle_new()
    assert frozen_garbage() is not None, "a frozen cycle is not scanned by settle_new"
    heap.settle()
    assert frozen_garbage() is None, "the next full settle collects it"
