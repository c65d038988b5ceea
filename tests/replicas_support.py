"""The bundled PlanetLab slices as a stream with deployments (imported as ``replicas_support``).

``data/planetlab-slices-slice`` holds real per-sliver CPU series of two
PlanetLab slices; a file's name is ``<node>_<slice>``. The stream books
each sliver as a VM of its slice's deployment on its node at time 0, then
carries the adapter's usage samples unchanged. Sizes are not in the trace:
1 core a VM, 8 a node (the data folder's README says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from support import PROJECT_ROOT

from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.schema import Event, HostUp, UsageSample, VmPlaced

SLICES_TRACE: Final = PROJECT_ROOT / "data" / "planetlab-slices-slice"
SLICES: Final = ("uw_oneswarm", "tsinghua_xyz")


def slice_of(vm_id: str) -> tuple[str, str]:
    """(node, slice) of a sliver's file name."""
    for name in SLICES:
        if vm_id.endswith("_" + name):
            return vm_id[: -len(name) - 1], name
    raise ValueError(f"{vm_id!r} belongs to none of the slices {SLICES}")


def slice_events(pool: str = "default", path: Path = SLICES_TRACE) -> list[Event]:
    """Hosts, bookings naming each sliver's deployment, then the real usage samples."""
    usage = [
        item
        for item in open_trace(path, seed=0, pool=pool).events()
        if not isinstance(item, BadRecord)
    ]
    assert all(isinstance(item, UsageSample) for item in usage)
    vms = sorted({item.vm_id for item in usage})
    nodes = sorted({slice_of(vm)[0] for vm in vms})
    events: list[Event] = [
        HostUp(time=0.0, pool=pool, host_id=node, cores=8.0, memory_gib=16.0) for node in nodes
    ]
    # Booked where the trace says they ran (vm.placed), not placed by lavad.
    events += [
        VmPlaced(
            time=0.0,
            pool=pool,
            vm_id=vm,
            host_id=slice_of(vm)[0],
            cores=1.0,
            memory_gib=1.0,
            deployment=slice_of(vm)[1],
        )
        for vm in vms
    ]
    return events + usage


def link_slices(planetlab: Path, into: Path) -> Path:
    """``into`` holding links to every sliver of ``SLICES`` in a PlanetLab day-folder set."""
    for day in sorted(p for p in planetlab.iterdir() if p.is_dir()):
        (into / day.name).mkdir(parents=True)
        for sliver in sorted(day.iterdir()):
            if any(sliver.name.endswith("_" + name) for name in SLICES):
                (into / day.name / sliver.name).symlink_to(sliver)
    return into
