"""Alibaba ``cluster-trace-gpu-v2023`` (OpenB): a real heterogeneous GPU cluster and its pods.

The node list ``openb_node_list_all_node.csv`` becomes ``HostUp`` events at
time 0, before any pod, so a replay places pods on the real host capacities
(cores = cpu_milli / 1000, memory GiB = memory_mib / 1024, GPUs, the GPU
model as label ``model`` when the node has one).

Each pod of an ``openb_pod_list_*.csv`` file becomes a ``VmRequest`` at its
``creation_time`` (cores = cpu_milli / 1000, memory GiB = memory_mib / 1024,
GPUs = num_gpu * gpu_milli / 1000, features ``qos`` and ``gpu_spec``) and a
``VmExit`` at its ``deletion_time``. Decisions:

- A pod whose ``deletion_time`` equals the trace end (12,902,960 s) was still
  running when the trace ended: right-censored, it gets no exit (and
  ``end_time`` says when the trace was cut). An empty deletion time is
  treated the same way.
- Pending pods (empty ``scheduled_time``: the cluster never placed them) still
  request: they are demand the cluster saw, and a scheduler under test may do
  better. Their exit, at deletion, means the request was withdrawn.
- ``pod_phase`` and ``scheduled_time`` describe the pod's future, so they are
  not features.

Pod lists are small (thousands of rows), so one is read whole and sorted by
creation time (``cpu050`` is not sorted); exits come out of a heap.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from lavad.streams.adapters.base import (
    CsvFile,
    RowError,
    Trace,
    TraceFormatError,
    TraceItem,
    TraceOptionError,
    bad_record,
    number,
    optional_time,
    pick_listed,
    rows_by_time,
    unique_id,
    with_later,
)
from lavad.streams.codec import BadRecord
from lavad.streams.schema import MAX_AMOUNT, Event, HostUp, VmExit, VmRequest

# The schema's bound on a quantity, in the trace's units (milli-cores, MiB).
_MILLI = 1000.0 * MAX_AMOUNT
_MIB = 1024.0 * MAX_AMOUNT

TRACE_END: Final = 12_902_960.0
NODE_LIST: Final = "openb_node_list_all_node.csv"
DEFAULT_PODS: Final = "default"
_POD_LIST = re.compile(r"openb_pod_list_(?P<name>.+)\.csv")
_POD_COLUMNS: Final = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "qos",
    "creation_time",
    "deletion_time",
)
_NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu")


def find_pod_lists(directory: Path) -> dict[str, Path]:
    """Pod list files ``openb_pod_list_<name>.csv`` in ``directory``, by name."""
    found: dict[str, Path] = {}
    for entry in directory.iterdir():
        match = _POD_LIST.fullmatch(entry.name)
        if match and entry.is_file():
            found[match["name"]] = entry
    return found


def sniff(path: Path) -> bool:
    """An ``openb_pod_list_*.csv`` file, or a directory with the node or a pod list."""
    if path.is_dir():
        return (path / NODE_LIST).is_file() or bool(find_pod_lists(path))
    return _POD_LIST.fullmatch(path.name) is not None


class AlibabaOpenb(Trace):
    """OpenB hosts (HostUp at 0) and pods (requests at creation, exits at deletion)."""

    name = "alibaba-openb"
    options = frozenset({"pods", "hosts"})
    vm_features = ("qos", "gpu_spec")

    def __init__(
        self, path: Path, *, seed: int, pool: str, pods: str | None = None, hosts: bool = True
    ) -> None:
        super().__init__(path, seed=seed, pool=pool)
        directory = path if path.is_dir() else path.parent
        if path.is_dir():
            lists = find_pod_lists(path)
            picked = pick_listed(path, lists, pods, what="pod list", default=DEFAULT_PODS)
            if picked is None:
                raise TraceFormatError(
                    path,
                    f"pod lists {sorted(lists) or 'none'} and no 'default'; "
                    "pass a pod list file or pods=<name>",
                )
            self.pods_file = picked[1]
        else:
            if pods is not None:
                raise TraceOptionError(
                    path, "pods= selects a pod list only when path is a directory"
                )
            self.pods_file = path
        self.pods = CsvFile(self.pods_file, _POD_COLUMNS)
        self.nodes: CsvFile | None = None
        if not isinstance(hosts, bool):
            raise TraceOptionError(path, f"hosts must be true or false, got {hosts!r}")
        if hosts:
            node_file = directory / NODE_LIST
            if not node_file.is_file():
                raise TraceFormatError(
                    directory, f"{NODE_LIST} is missing; pass hosts=False to replay the pods alone"
                )
            self.nodes = CsvFile(node_file, _NODE_COLUMNS)
        self.end_time = TRACE_END

    @property
    def has_hosts(self) -> bool:
        return self.nodes is not None

    def facts(self) -> dict[str, Any]:
        return {
            "pods_file": str(self.pods_file),
            "nodes_file": str(self.nodes.path) if self.nodes else None,
            "censoring": f"deletion_time == {TRACE_END:.0f} (trace end) or empty: no exit",
            "pending_pods": "request like the others (demand); their exit is a withdrawal",
            "features": list(self.vm_features),
            "source": "Alibaba cluster-trace-gpu-v2023 (OpenB), Weng et al., USENIX ATC'23",
            "licence": "Alibaba cluster trace terms: research or study use",
        }

    def events(self) -> Iterator[TraceItem]:
        if self.nodes is not None:
            yield from self._hosts(self.nodes)
        yield from with_later(self._pods())

    def _hosts(self, nodes: CsvFile) -> Iterator[TraceItem]:
        col = nodes.column
        model_col = col.get("model")
        seen: set[str] = set()
        for lineno, raw, cells in nodes.rows():
            if isinstance(cells, BadRecord):
                yield cells
                continue
            try:
                host_id = unique_id(cells, col["sn"], "sn", "host id", seen)
                cores = number(cells[col["cpu_milli"]], "cpu_milli", positive=True, maximum=_MILLI)
                memory = number(cells[col["memory_mib"]], "memory_mib", positive=True, maximum=_MIB)
                gpus = number(cells[col["gpu"]], "gpu", maximum=MAX_AMOUNT)
                cores, memory = cores / 1000.0, memory / 1024.0
            except RowError as exc:
                yield bad_record(nodes.path, lineno, raw, str(exc))
                continue
            seen.add(host_id)
            model = cells[model_col].strip() if model_col is not None else ""
            yield HostUp(
                time=0.0,
                pool=self.pool,
                host_id=host_id,
                cores=cores,
                memory_gib=memory,
                gpus=gpus,
                labels={"model": model} if model else {},
            )

    def _pods(self) -> Iterator[tuple[TraceItem, Event | None]]:
        """Pods sorted by (creation time, line); a bad row sorts after the row before it."""
        col = self.pods.column
        gpu_spec_col = col.get("gpu_spec")
        seen: set[str] = set()

        def parse(cells: list[str]) -> tuple[float, tuple[VmRequest, VmExit | None]]:
            vm_id = unique_id(cells, col["name"], "name", "pod name", seen)
            cores = number(cells[col["cpu_milli"]], "cpu_milli", positive=True, maximum=_MILLI)
            memory = number(cells[col["memory_mib"]], "memory_mib", maximum=_MIB) / 1024.0
            num_gpu = number(cells[col["num_gpu"]], "num_gpu", maximum=MAX_AMOUNT)
            gpu_milli = number(cells[col["gpu_milli"]], "gpu_milli", maximum=_MILLI)
            cores /= 1000.0
            created = number(cells[col["creation_time"]], "creation_time")
            deleted = optional_time(cells[col["deletion_time"]], "deletion_time")
            if deleted is not None and deleted < created:
                raise RowError(f"deletion_time {deleted:g} precedes creation_time {created:g}")
            seen.add(vm_id)
            request = VmRequest(
                time=created,
                pool=self.pool,
                vm_id=vm_id,
                cores=cores,
                memory_gib=memory,
                gpus=num_gpu * gpu_milli / 1000.0,
                features={
                    "qos": cells[col["qos"]].strip(),
                    "gpu_spec": cells[gpu_spec_col].strip() if gpu_spec_col is not None else "",
                },
            )
            exit_event = None
            if deleted is not None and deleted != TRACE_END:
                exit_event = VmExit(time=deleted, pool=self.pool, vm_id=vm_id)
            return created, (request, exit_event)

        for _, _, item in rows_by_time(self.pods, parse):
            if isinstance(item, BadRecord):
                yield item, None
            else:
                yield item
