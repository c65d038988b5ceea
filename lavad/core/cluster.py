"""Cluster state of one pool on numpy arrays, updated incrementally.

Every host is a column in ``capacity`` and ``free`` (rows are resources), so a
placement filter or score is a handful of vectorised operations over hosts and
nothing is recomputed from the VM list per request. Free capacity, VM counts,
the number of empty hosts and the used totals change in O(1) per place/exit.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

# Re-exported: the daemon names its arrays from here, the models from lavad.models.arrays.
from lavad.models.arrays import FloatArray as FloatArray  # noqa: PLC0414
from lavad.streams.schema import MAX_AMOUNT

RESOURCES: Final = ("cores", "memory_gib", "disk_gib", "gpus")
N_RESOURCES: Final = len(RESOURCES)

# Free capacity is kept by subtraction; trace shapes such as 0.1 cores are not
# exact in binary, so a fit allows this much rounding below zero.
FIT_TOLERANCE: Final = 1e-6

# A host has none of a resource (0) or at least this much of it. The scores
# divide by a host's capacity: a host of 5e-324 GiB had an infinite inverse,
# and Best Fit's score of it NaN, which left no host chosen and stopped the
# engine.
MIN_CAPACITY: Final = 1e-9

BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]


class HostState(IntEnum):
    DOWN = 0
    UP = 1
    DRAINING = 2


@dataclass(slots=True)
class VmRecord:
    """What a placed VM holds: its host column and the demand to give back."""

    vm_id: str
    host: int
    demand: tuple[float, float, float, float]
    deployment: str
    placed_at: float


class ClusterError(Exception):
    """An event that contradicts the cluster state (unknown host, duplicate VM, ...)."""


# The VMs a host runs at most (``[hosts] max_vms``): above ten times the most
# any policy puts on one host in the shared traces (64, Azure V1 on 64-core
# hosts), and nine times the 110 pods Kubernetes runs on a node by default.
MAX_VMS_PER_HOST: Final = 1_000


def capacity_problem(value: float) -> str | None:
    """What a host's capacity in a resource must be, if ``value`` is not that; else None."""
    if value == 0.0 or MIN_CAPACITY <= value <= MAX_AMOUNT:  # NaN fails both
        return None
    return f"a host's capacity must be 0 or within [{MIN_CAPACITY:g}, {MAX_AMOUNT:g}]"


class ClusterState:
    """Hosts and VMs of one pool.

    Columns are never reused: a host that goes down keeps its column (state
    DOWN) so host indices stay stable for policies that keep per-host arrays.
    """

    def __init__(self, initial_columns: int = 256, max_vms: int = MAX_VMS_PER_HOST) -> None:
        if type(max_vms) is not int or max_vms < 1:
            raise ValueError(f"max_vms must be an int >= 1, got {max_vms!r}")
        self._columns = max(1, initial_columns)
        # The VMs a host takes at most: at it, the host is unschedulable (below).
        self.max_vms = max_vms
        self.n_hosts = 0
        self.capacity: FloatArray = np.zeros((N_RESOURCES, self._columns))
        self.free: FloatArray = np.zeros((N_RESOURCES, self._columns))
        # 1/capacity (0 where a host lacks the resource) so scores normalise
        # with a multiply instead of a divide.
        self.inv_capacity: FloatArray = np.zeros((N_RESOURCES, self._columns))
        self.state: NDArray[np.int8] = np.zeros(self._columns, dtype=np.int8)
        # Up (not draining, not down): a host's state, as migrations and metrics read it.
        self.schedulable: BoolArray = np.zeros(self._columns, dtype=np.bool_)
        # What placement reads: not up, or running ``max_vms`` VMs already.
        self.unschedulable: BoolArray = np.ones(self._columns, dtype=np.bool_)
        self.vm_count: NDArray[np.int32] = np.zeros(self._columns, dtype=np.int32)
        self.host_ids: list[str] = []
        self.host_index: dict[str, int] = {}
        self.vms: dict[str, VmRecord] = {}
        # Per-host VM ids, for policies and migrations that enumerate a host.
        self.host_vms: list[set[str]] = []
        # Incremental aggregates over UP and DRAINING hosts.
        self.hosts_up = 0
        self.hosts_empty = 0
        # Python floats: updated on every place/exit, where numpy scalars cost more.
        self.used_total = [0.0] * N_RESOURCES
        self.capacity_total = [0.0] * N_RESOURCES
        # Resources some host has: scores skip the others (disk on Azure, ...).
        self.resource_present = np.zeros(N_RESOURCES, dtype=np.bool_)
        # Bumped on every change, so samplers can tell an unchanged state.
        self.version = 0
        # Deployment -> host -> count: the anti-affinity filter's limit per host,
        # and the hosts the deployment affinity prefers.
        self.deployment_hosts: dict[str, dict[int, int]] = {}
        # Deployment -> (stamp, the deployment's stamp before it or 0, host) of the
        # last host to join or leave its ``deployment_hosts``; gone with them. A
        # stamp counts such changes in the whole pool, so a reader that saw its
        # stamp can tell "nothing changed" and "only this host" from "rebuild"
        # in O(1), even across the deployment emptying and coming back (its
        # first change after that has 0 before it, as when it was never seen).
        self.deployment_changes: dict[str, tuple[int, int, int]] = {}
        self._membership_stamp = 0

    def check_restored(self) -> None:
        """Raise ValueError if a restored state's arrays cannot hold its hosts.

        Compiled scans index these arrays by host up to ``n_hosts`` without a
        bounds check, so a snapshot (checksummed, not signed) is checked once
        on restore (the snapshot codec calls this).
        """
        columns = self._columns
        if type(self.max_vms) is not int or self.max_vms < 1:
            raise ValueError(f"max_vms {self.max_vms!r} is not an int >= 1")
        if type(self.n_hosts) is not int or not 0 <= self.n_hosts <= columns:
            raise ValueError(f"n_hosts {self.n_hosts!r} outside [0, {columns}]")
        expected: dict[str, tuple[NDArray[Any], Any, tuple[int, ...]]] = {
            "capacity": (self.capacity, np.float64, (N_RESOURCES, columns)),
            "free": (self.free, np.float64, (N_RESOURCES, columns)),
            "inv_capacity": (self.inv_capacity, np.float64, (N_RESOURCES, columns)),
            "state": (self.state, np.int8, (columns,)),
            "schedulable": (self.schedulable, np.bool_, (columns,)),
            "unschedulable": (self.unschedulable, np.bool_, (columns,)),
            "vm_count": (self.vm_count, np.int32, (columns,)),
            "resource_present": (self.resource_present, np.bool_, (N_RESOURCES,)),
        }
        for name, (array, dtype, shape) in expected.items():
            if not isinstance(array, np.ndarray):
                raise ValueError(f"{name} is {type(array).__name__}, not an array")
            if array.dtype != np.dtype(dtype) or array.shape != shape:
                raise ValueError(
                    f"{name} is {array.dtype} {array.shape}, not {np.dtype(dtype)} {shape}"
                )
            if not array.flags.c_contiguous:
                raise ValueError(f"{name} is not contiguous")
        if len(self.host_ids) != self.n_hosts or len(self.host_vms) != self.n_hosts:
            ids, lists = len(self.host_ids), len(self.host_vms)
            raise ValueError(f"{ids} host ids and {lists} VM lists for {self.n_hosts} hosts")
        self._check_deployments()

    def _check_deployments(self) -> None:
        """The deployment affinity writes its levels at these hosts, and trusts a
        stamp it has seen to mean the hosts it marked then."""
        if self.deployment_changes.keys() != self.deployment_hosts.keys():
            raise ValueError("deployment_changes and deployment_hosts name other deployments")
        for deployment, per_host in self.deployment_hosts.items():
            if type(per_host) is not dict or not per_host:
                raise ValueError(f"deployment {deployment!r} holds no host")
            if not all(type(h) is int and 0 <= h < self.n_hosts for h in per_host):
                raise ValueError(f"deployment {deployment!r} holds a host out of range")
            # The anti-affinity filter compares these counts with its limit, and a
            # release keeps a host until its count falls to 0.
            if not all(type(c) is int and c > 0 for c in per_host.values()):
                raise ValueError(f"deployment {deployment!r} holds a VM count below 1")
            change = self.deployment_changes[deployment]
            if not (
                type(change) is tuple and len(change) == 3 and all(type(v) is int for v in change)
            ):
                raise ValueError(f"deployment {deployment!r} has a change of the wrong form")
            stamp, before, host = change
            if not 0 <= before < stamp <= self._membership_stamp or not 0 <= host < self.n_hosts:
                raise ValueError(f"deployment {deployment!r} has a change out of order or range")

    # ----------------------------------------------------------------- hosts

    def add_host(self, host_id: str, capacity: tuple[float, float, float, float]) -> int:
        """Bring a host up (new, or back from DOWN). Returns its column."""
        for name, value in zip(RESOURCES, capacity, strict=True):
            problem = capacity_problem(value)
            if problem is not None:
                raise ClusterError(f"host {host_id!r} has {name} {value!r}: {problem}")
        index = self.host_index.get(host_id)
        if index is not None:
            if self.state[index] != HostState.DOWN:
                raise ClusterError(f"host {host_id!r} is already up")
            if self.vm_count[index]:
                raise ClusterError(f"host {host_id!r} came back with VMs still booked")
        else:
            index = self.n_hosts
            if index == self._columns:
                self._grow()
            self.n_hosts += 1
            self.host_ids.append(host_id)
            self.host_index[host_id] = index
            self.host_vms.append(set())
        cap = np.asarray(capacity, dtype=np.float64)
        self.capacity[:, index] = cap
        self.free[:, index] = cap
        with np.errstate(divide="ignore"):
            self.inv_capacity[:, index] = np.where(cap > 0, 1.0 / np.where(cap > 0, cap, 1.0), 0.0)
        self._set_state(index, HostState.UP)
        self.hosts_up += 1
        self.hosts_empty += 1
        for r in range(N_RESOURCES):
            self.capacity_total[r] += capacity[r]
        self.resource_present |= cap > 0
        return index

    def _set_state(self, index: int, state: HostState) -> None:
        """Move host column ``index`` to ``state``: only an UP host takes VMs, and the
        filters and kernels read that from ``schedulable`` and ``unschedulable``,
        which must never disagree with the state (nor, for the latter, the host's
        VM count: ``_recheck_room``)."""
        self.version += 1
        self.state[index] = state
        self.schedulable[index] = state == HostState.UP
        self._recheck_room(index)

    def _recheck_room(self, host: int) -> None:
        # A host at its VM limit stays up (migrations, metrics) but takes no
        # VM: every filter and compiled scan reads ``unschedulable``, so one
        # place holds the limit for every policy. It bounds what a host's VMs
        # cost each event that walks them (an exit recomputing the host's
        # latest exit), whatever a flood of VMs of no demand asks.
        self.unschedulable[host] = not self.schedulable[host] or self.vm_count[host] >= self.max_vms

    def drain_host(self, host_id: str) -> int:
        index = self._known_host(host_id)
        if self.state[index] == HostState.DOWN:
            raise ClusterError(f"host {host_id!r} is down; it cannot drain")
        self._set_state(index, HostState.DRAINING)
        return index

    def undrain_host(self, host_id: str) -> int:
        """A draining host opens for placement again (emptied, or maintenance done)."""
        index = self._known_host(host_id)
        if self.state[index] != HostState.DRAINING:
            raise ClusterError(f"host {host_id!r} is not draining")
        self._set_state(index, HostState.UP)
        return index

    def remove_host(self, host_id: str) -> list[VmRecord]:
        """Take a host down. VMs still on it are evicted and returned."""
        index = self._known_host(host_id)
        if self.state[index] == HostState.DOWN:
            raise ClusterError(f"host {host_id!r} is already down")
        evicted = [self.release(vm_id) for vm_id in sorted(self.host_vms[index])]
        self._set_state(index, HostState.DOWN)
        self.hosts_up -= 1
        self.hosts_empty -= 1
        for r in range(N_RESOURCES):
            self.capacity_total[r] -= float(self.capacity[r, index])
        self.free[:, index] = 0.0
        return evicted

    # ------------------------------------------------------------------- VMs

    def book(
        self,
        vm_id: str,
        host: int,
        demand: tuple[float, float, float, float],
        deployment: str,
        now: float,
    ) -> VmRecord:
        """Charge ``demand`` to host column ``host``. The caller has checked the fit."""
        if vm_id in self.vms:
            raise ClusterError(f"VM {vm_id!r} is already placed")
        self.version += 1
        free = self.free
        used = self.used_total
        for r in range(N_RESOURCES):
            amount = demand[r]
            if amount:
                free[r, host] -= amount
                used[r] += amount
        residents = self.host_vms[host]
        if not residents:
            self.hosts_empty -= 1
        residents.add(vm_id)
        count = self.vm_count[host] = self.vm_count[host] + 1
        if count >= self.max_vms:
            self.unschedulable[host] = True
        record = VmRecord(vm_id, host, demand, deployment, now)
        self.vms[vm_id] = record
        if deployment:
            per_host = self.deployment_hosts.setdefault(deployment, {})
            held = per_host.get(host, 0)
            per_host[host] = held + 1
            if not held:
                self._membership_changed(deployment, host)
        return record

    def release(self, vm_id: str) -> VmRecord:
        """Give back exactly what ``book`` charged."""
        record = self.vms.pop(vm_id, None)
        if record is None:
            raise ClusterError(f"VM {vm_id!r} is not placed")
        self.version += 1
        host = record.host
        free = self.free
        used = self.used_total
        demand = record.demand
        for r in range(N_RESOURCES):
            amount = demand[r]
            if amount:
                free[r, host] += amount
                used[r] -= amount
        count = self.vm_count[host] = self.vm_count[host] - 1
        if count + 1 >= self.max_vms:
            self._recheck_room(host)
        residents = self.host_vms[host]
        residents.discard(vm_id)
        if not residents:
            self.hosts_empty += 1
            # Snap back to capacity: no rounding residue survives an empty host.
            free[:, host] = self.capacity[:, host]
        if record.deployment:
            per_host = self.deployment_hosts[record.deployment]
            left = per_host[host] - 1
            if left:
                per_host[host] = left
            else:
                del per_host[host]
                if per_host:
                    self._membership_changed(record.deployment, host)
                else:
                    del self.deployment_hosts[record.deployment]
                    del self.deployment_changes[record.deployment]
        return record

    def _membership_changed(self, deployment: str, host: int) -> None:
        """``host`` joined or left ``deployment_hosts[deployment]``: a new stamp."""
        stamp = self._membership_stamp = self._membership_stamp + 1
        last = self.deployment_changes.get(deployment)
        self.deployment_changes[deployment] = (stamp, 0 if last is None else last[0], host)

    # ----------------------------------------------------------------- views

    def fits_capacity(self, demand: tuple[float, float, float, float]) -> BoolArray:
        """Hosts (up or draining) whose *total* capacity could ever hold ``demand``."""
        n = self.n_hosts
        ok: BoolArray = self.state[:n] != HostState.DOWN
        for r in range(N_RESOURCES):
            if demand[r]:
                ok &= self.capacity[r, :n] >= demand[r] - FIT_TOLERANCE
        return ok

    def _known_host(self, host_id: str) -> int:
        index = self.host_index.get(host_id)
        if index is None:
            raise ClusterError(f"unknown host {host_id!r}")
        return index

    def _grow(self) -> None:
        old = self._columns
        new = old * 2

        def widen(array: NDArray[np.generic]) -> NDArray[np.generic]:
            shape = (*array.shape[:-1], new)
            grown = np.zeros(shape, dtype=array.dtype)
            grown[..., :old] = array
            return grown

        self.capacity = widen(self.capacity)  # type: ignore[assignment]
        self.free = widen(self.free)  # type: ignore[assignment]
        self.inv_capacity = widen(self.inv_capacity)  # type: ignore[assignment]
        self.state = widen(self.state)  # type: ignore[assignment]
        self.schedulable = widen(self.schedulable)  # type: ignore[assignment]
        unschedulable = np.ones(new, dtype=np.bool_)
        unschedulable[:old] = self.unschedulable
        self.unschedulable = unschedulable
        self.vm_count = widen(self.vm_count)  # type: ignore[assignment]
        self._columns = new
