"""Whether a lifetime tracker restored from a snapshot can be handed to the compiled kernels.

The kernels (``kernels.py``) index the tracker's packed arrays with the
numbers those arrays hold (a slot's host, its neighbours on the host's
list, its group rows) and numba does not check bounds. A snapshot passes a
checksum, but a checksum is not a signature: a snapshot crafted or damaged
with a valid checksum could carry an index past an array's end, and the
first booking would write outside the array. So a restored tracker is
checked once, before its pool decides anything: shapes, dtypes, memory
layout, and every index a kernel follows within its array. The cost is a
few vectorised passes over the slots and hosts, once per restore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lavad.core.placement.kernels import (
    ALIVE,
    HEAD,
    HOLDER,
    HOST,
    HOST_INTS,
    HOST_TIMES,
    NEXT_ON_HOST,
    PREV_ON_HOST,
    ROW,
    SLOT_FLAGS,
    SLOT_INTS,
    SLOT_TIMES,
)
from lavad.models.lifetime.features import LEVELS


@dataclass(frozen=True, slots=True)
class PackedTracker:
    """What the kernels read of a restored lifetime tracker, as the check takes it
    (the tracker hands it over, so this module need not know the tracker)."""

    slot_times: Any
    slot_ints: Any
    slot_flags: Any
    levels: Any
    host_times: Any
    host_ints: Any
    host_q: Any
    vm_ids: list[str]
    slot_rows: list[Any]
    free: list[int]
    model: object


def _array(name: str, value: Any, dtype: type, rows: int | None, columns: int | None) -> Any:
    if not isinstance(value, np.ndarray):
        raise ValueError(f"{name} is {type(value).__name__}, not an array")
    if value.dtype != np.dtype(dtype) or value.ndim != 2:
        raise ValueError(
            f"{name} is a {value.ndim}-d {value.dtype} array, not 2-d {np.dtype(dtype)}"
        )
    if not value.flags.c_contiguous:
        raise ValueError(f"{name} is not contiguous")
    if rows is not None and value.shape[0] != rows:
        raise ValueError(f"{name} has {value.shape[0]} rows, not {rows}")
    if columns is not None and value.shape[1] != columns:
        raise ValueError(f"{name} has {value.shape[1]} columns, not {columns}")
    return value


def _within(name: str, values: Any, low: int, high: int) -> None:
    """Every value in [low, high)."""
    if len(values) and (int(values.min()) < low or int(values.max()) >= high):
        raise ValueError(
            f"{name} holds {int(values.min())}..{int(values.max())}, outside [{low}, {high})"
        )


def check_tracker_state(tracker: PackedTracker) -> None:
    """Raise ValueError naming the first inconsistency a kernel could trip on."""
    slot_times = _array("slot times", tracker.slot_times, np.float64, SLOT_TIMES, None)
    slots = slot_times.shape[1]
    slot_ints = _array("slot ints", tracker.slot_ints, np.int64, SLOT_INTS, slots)
    flags = _array("slot flags", tracker.slot_flags, np.bool_, SLOT_FLAGS, slots)
    levels = _array("slot levels", tracker.levels, np.int64, slots, LEVELS)
    host_times = _array("host times", tracker.host_times, np.float64, HOST_TIMES, None)
    hosts = host_times.shape[1]
    host_ints = _array("host ints", tracker.host_ints, np.int64, HOST_INTS, hosts)
    _array("host quantiles", tracker.host_q, np.float64, hosts, None)
    if len(tracker.vm_ids) != slots or len(tracker.slot_rows) != slots:
        ids, tuples = len(tracker.vm_ids), len(tracker.slot_rows)
        raise ValueError(f"{ids} VM ids and {tuples} row tuples for {slots} slots")
    _within("a slot's host", slot_ints[HOST], -1, hosts)
    _within("a slot's next VM on its host", slot_ints[NEXT_ON_HOST], -1, slots)
    _within("a slot's previous VM on its host", slot_ints[PREV_ON_HOST], -1, slots)
    _within("a host's first VM", host_ints[HEAD], -1, slots)
    _within("a host's latest-exit VM", host_ints[HOLDER], -1, slots)
    free = tracker.free
    if any(type(slot) is not int or not 0 <= slot < slots for slot in free):
        raise ValueError(f"a free slot outside [0, {slots})")
    alive = flags[ALIVE]
    model = tracker.model
    mass = getattr(model, "mass", None)
    if isinstance(mass, np.ndarray):
        _within("a running VM's row", slot_ints[ROW][alive], 0, len(mass))
    deaths = getattr(model, "deaths", None)
    censored = getattr(model, "censored", None)
    if isinstance(deaths, np.ndarray) and isinstance(censored, np.ndarray):
        if deaths.shape != censored.shape or deaths.ndim != 2:
            raise ValueError(
                f"the model's deaths {deaths.shape} and censorings {censored.shape} differ"
            )
        _within("a running VM's group rows", levels[alive].ravel(), 0, len(deaths))
