"""Alibaba ``cluster-trace-gpu-v2025``: disaggregated DLRM serving instances of 156 apps.

Each row is one inference instance of an app (``app_name``). Two views:

``view="vms"`` (default)
    A ``VmRequest`` per instance at ``creation_time`` (cores = cpu_request,
    memory GiB = memory_request, disk GiB = disk_request, GPUs = gpu_request,
    deployment = app_name, ``max_per_host`` = max_instance_per_node with -1
    meaning no limit, features ``role`` and ``preexisting``) and a ``VmExit``
    at ``deletion_time``.
``view="deployments"``
    Admission-control view: ``DeploymentArrival`` at an app's first instance
    (its initial size is that one instance), ``DeploymentScaleOut`` for every
    later instance creation, ``DeploymentScaleIn`` at every deletion, each
    carrying the instance's cores and memory.

Empty or NaN times lie outside the trace window: an instance with no
creation time existed before the window and is requested at time 0 with
feature ``preexisting=True`` (its age is unknown: a lifetime model must treat
it as left-truncated); one with no deletion time outlived the window and gets
no exit / scale-in (right-censored). The window's end is not published, so
``end_time`` is None. The file is small (24k rows): it is read whole, sorted
by (creation time, line), and deletions are merged through a heap.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Literal

from lavad.streams.adapters.base import (
    CsvFile,
    RowError,
    Trace,
    TraceFormatError,
    TraceItem,
    TraceOptionError,
    number,
    optional_time,
    rows_by_time,
    sniff_header,
    with_later,
)
from lavad.streams.codec import BadRecord
from lavad.streams.schema import (
    MAX_AMOUNT,
    DeploymentArrival,
    DeploymentScaleIn,
    DeploymentScaleOut,
    Event,
    VmExit,
    VmRequest,
)

FILE_NAME: Final = "disaggregated_DLRM_trace.csv"
HEADER_PREFIX: Final = "instance_sn,role,app_name"
_COLUMNS: Final = (
    "instance_sn",
    "role",
    "app_name",
    "cpu_request",
    "gpu_request",
    "memory_request",
    "disk_request",
    "max_instance_per_node",
    "creation_time",
    "deletion_time",
)
View = Literal["vms", "deployments"]


def sniff(path: Path) -> bool:
    """The DLRM instance CSV (by header), or a directory holding it."""
    if path.is_dir():
        return (path / FILE_NAME).is_file()
    return path.suffix == ".csv" and sniff_header(path, HEADER_PREFIX)


class _Instance:
    """One parsed instance row."""

    __slots__ = (
        "app",
        "cores",
        "created",
        "deleted",
        "disk",
        "gpus",
        "max_per_host",
        "memory",
        "preexisting",
        "raw_max",
        "role",
        "vm_id",
    )

    def __init__(self, cells: list[str], col: dict[str, int]) -> None:
        self.vm_id = cells[col["instance_sn"]].strip()
        self.app = cells[col["app_name"]].strip()
        self.role = cells[col["role"]].strip()
        if not self.vm_id:
            raise RowError("instance_sn: empty")
        if not self.app:
            raise RowError("app_name: empty")
        self.cores = number(
            cells[col["cpu_request"]], "cpu_request", positive=True, maximum=MAX_AMOUNT
        )
        self.gpus = number(cells[col["gpu_request"]], "gpu_request", maximum=MAX_AMOUNT)
        self.memory = number(cells[col["memory_request"]], "memory_request", maximum=MAX_AMOUNT)
        self.disk = number(cells[col["disk_request"]], "disk_request", maximum=MAX_AMOUNT)
        limit = number(cells[col["max_instance_per_node"]], "max_instance_per_node", minimum=-1)
        if limit != int(limit) or limit == 0:
            raise RowError(f"max_instance_per_node: want -1 or a positive integer, got {limit:g}")
        self.raw_max = int(limit)
        self.max_per_host = None if limit == -1 else int(limit)
        created = optional_time(cells[col["creation_time"]], "creation_time")
        self.preexisting = created is None
        self.created = 0.0 if created is None else created
        self.deleted = optional_time(cells[col["deletion_time"]], "deletion_time")
        if self.deleted is not None and self.deleted < self.created:
            raise RowError(
                f"deletion_time {self.deleted:g} precedes creation_time {self.created:g}"
            )


class AlibabaDlrm(Trace):
    """DLRM serving instances as VMs (``view="vms"``) or as deployment scaling."""

    name = "alibaba-dlrm"
    options = frozenset({"view"})
    vm_features = ("role", "preexisting")

    def __init__(self, path: Path, *, seed: int, pool: str, view: str = "vms") -> None:
        super().__init__(path, seed=seed, pool=pool)
        if view not in ("vms", "deployments"):
            raise TraceOptionError(path, f"view must be 'vms' or 'deployments', got {view!r}")
        self.view: View = "vms" if view == "vms" else "deployments"
        file = path / FILE_NAME if path.is_dir() else path
        if not file.is_file():
            raise TraceFormatError(path, f"{FILE_NAME} is missing")
        self.csv = CsvFile(file, _COLUMNS)

    def facts(self) -> dict[str, Any]:
        return {
            "file": str(self.csv.path),
            "view": self.view,
            "preexisting": "no creation_time: existed before the window, requested at 0",
            "censoring": "no deletion_time: outlived the window, no exit / scale-in",
            "features": list(self.vm_features)
            if self.view == "vms"
            else ["role", "max_instance_per_node", "gpus"],
            "source": "Alibaba cluster-trace-gpu-v2025 (Yang et al., NSDI'25)",
            "licence": "Alibaba cluster trace terms: research or study use",
        }

    def _rows(self) -> list[tuple[float, int, _Instance | BadRecord]]:
        seen: set[str] = set()
        column = self.csv.column

        def parse(cells: list[str]) -> tuple[float, _Instance]:
            instance = _Instance(cells, column)
            if instance.vm_id in seen:
                raise RowError(f"instance_sn: duplicate {instance.vm_id!r}")
            seen.add(instance.vm_id)
            return instance.created, instance

        return rows_by_time(self.csv, parse)

    def events(self) -> Iterator[TraceItem]:
        pairs = self._vm_pairs() if self.view == "vms" else self._deployment_pairs()
        yield from with_later(pairs)

    def _vm_pairs(self) -> Iterator[tuple[TraceItem, Event | None]]:
        pool = self.pool
        for _, _, row in self._rows():
            if isinstance(row, BadRecord):
                yield row, None
                continue
            request = VmRequest(
                time=row.created,
                pool=pool,
                vm_id=row.vm_id,
                cores=row.cores,
                memory_gib=row.memory,
                disk_gib=row.disk,
                gpus=row.gpus,
                deployment=row.app,
                max_per_host=row.max_per_host,
                features={"role": row.role, "preexisting": row.preexisting},
            )
            gone = (
                None
                if row.deleted is None
                else VmExit(time=row.deleted, pool=pool, vm_id=row.vm_id)
            )
            yield request, gone

    def _deployment_pairs(self) -> Iterator[tuple[TraceItem, Event | None]]:
        pool = self.pool
        admitted: set[str] = set()
        for _, _, row in self._rows():
            if isinstance(row, BadRecord):
                yield row, None
                continue
            event: Event
            if row.app in admitted:
                event = DeploymentScaleOut(
                    time=row.created,
                    pool=pool,
                    deployment_id=row.app,
                    cores=row.cores,
                    memory_gib=row.memory,
                )
            else:
                admitted.add(row.app)
                event = DeploymentArrival(
                    time=row.created,
                    pool=pool,
                    deployment_id=row.app,
                    cores=row.cores,
                    memory_gib=row.memory,
                    features={
                        "role": row.role,
                        "max_instance_per_node": row.raw_max,
                        "gpus": row.gpus,
                    },
                )
            gone = None
            if row.deleted is not None:
                gone = DeploymentScaleIn(
                    time=row.deleted,
                    pool=pool,
                    deployment_id=row.app,
                    cores=row.cores,
                    memory_gib=row.memory,
                )
            yield event, gone
