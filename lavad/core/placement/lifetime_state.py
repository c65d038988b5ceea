"""The lifetime tracker's per-slot and per-host state: packed arrays that own their layout.

Each column of the tracker (a slot's start, its host, a host's latest exit,
...) is one row of a 2-D array packed by type, so that a compiled call
takes a few arrays instead of one per column (``kernels.py`` names the
rows: ``START``, ``HOST``, ``HOST_EXIT``, ...). These classes hold the
arrays, name their rows as views, and grow them; the tracker
(``lifetime.py``) decides what goes in them, and ``tracker_state.py``
checks them after a restore.
"""

from __future__ import annotations

from typing import Generic, TypeVar, overload

import numpy as np
from numpy.typing import NDArray

from lavad.core.cluster import BoolArray, FloatArray, IntArray
from lavad.core.placement.kernels import (
    ALIVE,
    GENERATION,
    HEAD,
    HOLDER,
    HOST,
    HOST_EXIT,
    HOST_INITIAL_EXIT,
    HOST_INTS,
    HOST_TIMES,
    INITIAL_EXIT,
    LEARNS,
    NEXT_ON_HOST,
    PREDICTED_AT,
    PREDICTED_EXIT,
    PREV_ON_HOST,
    QUANTILES_EXIT,
    QUANTILES_STAMP,
    ROW,
    SLOT_FLAGS,
    SLOT_INTS,
    SLOT_TIMES,
    START,
    PackedColumns,
)

_Scalar = TypeVar("_Scalar", bound=np.generic)


class _Row(Generic[_Scalar]):
    """A named row of one of the packed arrays the object holds (``times``, ``ints``,
    ``flags``): one column of the tracker, read as a contiguous view. The view is taken
    at each read, as the arrays are replaced when they grow."""

    def __init__(self, packed: str, index: int) -> None:
        self.packed = packed
        self.index = index

    @overload
    def __get__(self, obj: None, owner: type) -> _Row[_Scalar]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> NDArray[_Scalar]: ...

    def __get__(self, obj: object, owner: type) -> _Row[_Scalar] | NDArray[_Scalar]:
        if obj is None:
            return self
        row: NDArray[_Scalar] = getattr(obj, self.packed)[self.index]
        return row


def _rows(_scalar: type[_Scalar], packed: str, *indices: int) -> tuple[_Row[_Scalar], ...]:
    """The named rows ``indices`` of the packed array ``packed`` (of ``_scalar``s)."""
    return tuple(_Row[_Scalar](packed, index) for index in indices)


class SlotColumns:
    """Per slot (one column each): times (float64), ints (int64) and flags (bool).

    A slot holds one running VM; a free slot's host and list links are -1.
    """

    def __init__(self, size: int) -> None:
        self.times: FloatArray = np.zeros((SLOT_TIMES, size))
        self.ints: IntArray = np.zeros((SLOT_INTS, size), dtype=np.int64)
        self.ints[[HOST, NEXT_ON_HOST, PREV_ON_HOST]] = -1
        self.flags: BoolArray = np.zeros((SLOT_FLAGS, size), dtype=np.bool_)

    @property
    def size(self) -> int:
        return int(self.times.shape[1])

    def grow(self) -> int:
        """Double the slots; return how many there were (the first new one)."""
        size = self.size
        self.times = np.concatenate([self.times, np.zeros((SLOT_TIMES, size))], axis=1)
        ints = np.zeros((SLOT_INTS, size), dtype=np.int64)
        ints[[HOST, NEXT_ON_HOST, PREV_ON_HOST]] = -1
        self.ints = np.concatenate([self.ints, ints], axis=1)
        flags = np.zeros((SLOT_FLAGS, size), dtype=np.bool_)
        self.flags = np.concatenate([self.flags, flags], axis=1)
        return size

    def packed_with(self, levels: IntArray, hosts: HostColumns) -> PackedColumns:
        """What booking and releasing a slot write (``kernels.PackedColumns``): these
        slots' arrays, their group ``levels``, and ``hosts``' times and ints."""
        return (self.times, self.ints, self.flags, levels, hosts.times, hosts.ints)

    # Rows of ``times``: when its VM was placed; E[T] at creation as an exit
    # (LA-Binary's one-shot prediction); its VM's latest predicted exit; when
    # that was last set (its remaining-life quantiles are those of T_r | T_u at
    # that uptime).
    start, initial_exit, predicted_exit, predicted_at = _rows(
        np.float64, "times", START, INITIAL_EXIT, PREDICTED_EXIT, PREDICTED_AT
    )
    # Rows of ``ints``: its VM's host (-1: free); its VM's chosen distribution
    # row; its generation (heap entries of a former occupant are stale); the
    # next and the previous slot on its host's list (-1 ends it): each host's
    # VMs are a doubly linked list, so the compiled booking and release find a
    # host's latest exits without Python sets.
    host, row, generation, next_on_host, prev_on_host = _rows(
        np.int64, "ints", HOST, ROW, GENERATION, NEXT_ON_HOST, PREV_ON_HOST
    )
    # Rows of ``flags``: whether it holds a running VM; whether the model
    # learns from its VM (not when it is left-truncated:
    # ``features.left_truncated``).
    alive, learns = _rows(np.bool_, "flags", ALIVE, LEARNS)


class HostColumns:
    """Per host (one column each): times (float64), ints (int64), and the exit
    times at the tracker's host quantile levels (hosts, H).

    A host's quantiles are those of the VM holding its latest exit, for the
    exit in ``quantiles_exit`` (NaN: stale), rewritten lazily before a
    placement; ``quantiles_stamp`` counts the rewrites, the version a
    policy's kept LAS floors name.
    """

    def __init__(self, quantile_levels: int) -> None:
        self.times: FloatArray = np.zeros((HOST_TIMES, 0))
        self.ints: IntArray = np.zeros((HOST_INTS, 0), dtype=np.int64)
        self.quantiles: FloatArray = np.full((0, quantile_levels), -np.inf)

    def grow(self, n_hosts: int) -> None:
        """Make room for hosts ``[0, n_hosts)``: a new host has no VMs and stale quantiles."""
        hosts = self.times.shape[1]
        if n_hosts > hosts:
            grown = max(n_hosts, 2 * hosts, 64) - hosts
            times = np.full((HOST_TIMES, grown), -np.inf)
            times[QUANTILES_EXIT] = np.nan
            self.times = np.concatenate([self.times, times], axis=1)
            ints = np.full((HOST_INTS, grown), -1, dtype=np.int64)
            ints[QUANTILES_STAMP] = 0
            self.ints = np.concatenate([self.ints, ints], axis=1)
            self.quantiles = np.concatenate(
                [self.quantiles, np.full((grown, self.quantiles.shape[1]), -np.inf)]
            )

    def exits(self, n_hosts: int, now: float, *, repredict: bool) -> FloatArray:
        """Per host, the latest predicted exit of its VMs (``now`` for a host without any).

        ``repredict``: the current predictions (LAS); else each VM's exit as
        predicted at its creation (LA-Binary).
        """
        self.grow(n_hosts)
        exits = self.exit if repredict else self.initial_exit
        return np.maximum(exits[:n_hosts], now)

    def latest(self, n_hosts: int) -> FloatArray:
        """``exits(repredict=True)`` unclipped (-inf for a host without VMs), not a copy."""
        self.grow(n_hosts)
        return self.exit

    def current_quantiles(self, n_hosts: int) -> FloatArray:
        """The quantiles of hosts ``[0, n_hosts)`` as they stand, for a caller that has
        just brought them up to date (a refreshed scan over them, or the tracker's
        ``host_exit_quantiles``)."""
        return self.quantiles[:n_hosts]

    def members(self, host: int, slots: SlotColumns) -> list[int]:
        """The slots of ``host``'s VMs, in its list's order."""
        members: list[int] = []
        following = slots.next_on_host
        head = self.head
        slot = int(head[host]) if host < len(head) else -1
        while slot >= 0 and len(members) < len(following):  # a list holds each slot once
            members.append(slot)
            slot = int(following[slot])
        return members

    def on_host(self, slots: SlotColumns) -> dict[int, set[int]]:
        """Each host with VMs and its VMs' slots (for inspection; the lists are the state)."""
        hosts = np.flatnonzero(self.head >= 0).tolist()
        return {host: set(self.members(host, slots)) for host in hosts}

    # Rows of ``times``: the latest predicted exit of its VMs (-inf: none); the
    # latest exit of its VMs as predicted at their creation; the ``exit`` its
    # quantiles were computed for (NaN: stale).
    exit, initial_exit, quantiles_exit = _rows(
        np.float64, "times", HOST_EXIT, HOST_INITIAL_EXIT, QUANTILES_EXIT
    )
    # Rows of ``ints``: the slot holding ``exit``, the lowest slot among its VMs
    # with the latest predicted exit (-1: none, or to be found again from the
    # host's VMs when next needed); the first slot of its list of VMs (-1:
    # none); how many times its quantiles were rewritten.
    holder, head, quantiles_stamp = _rows(np.int64, "ints", HOLDER, HEAD, QUANTILES_STAMP)
