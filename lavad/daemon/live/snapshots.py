"""Per-partition snapshots: the pools a partition carries plus the input offsets they reflect.

A pool's events all arrive on one partition number of the (co-partitioned)
input topics, so that number is the unit that moves between instances: the
snapshot of partition ``p`` holds every pool seen on ``p`` and, for each input
topic, the offset of the next record of ``(topic, p)`` not yet reflected in
that state. Restoring it and seeking to those offsets re-derives exactly the
decisions that followed it, with the same ids.

The file is a one-line JSON header (format, version, engine fingerprint,
partition, offsets, pools, checksum of the body) and then the pools written by
``state_codec``: data only (a JSON structure and raw numpy array bytes), so
a file that someone else wrote can at worst be refused, never run code as
lavad (the checksum guards against truncation, not against an author who
recomputes it). A snapshot from another format version or another engine
configuration is refused with the reason, not half-loaded. Writes go to a
temporary file that is fsynced and renamed, so a kill -9 leaves the previous
snapshot intact.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from lavad.core.engine import PoolRuntime
from lavad.daemon.folders import make_writable_folder
from lavad.daemon.live.state_codec import StateCodecError, dumps, loads

SNAPSHOT_FORMAT = "lavad.partition-snapshot"
# 2: pools carry limit recommenders; 3: and migration planners; 4: state_codec, no
# pickle; 5: the lifetime tracker keeps each host's exit holder and cached deadlines,
# LAVA its creation quantiles per model row, the ml limit choice its anchor rungs
# (a v4 pool would load partly and fail at its first placement, so it is refused);
# 6: the lifetime tracker keeps each host's VMs as a linked list of slots (not a set)
# and its predictions per keys tuple, the ml limit choice its price per change and
# the time of the VPA's last memory overrun (a v5 pool would fail at its first event);
# 7: the lifetime tracker's per-slot and per-host arrays packed into a few 2-D arrays,
# LAS's floors' epochs and stamps into one (a v6 pool would fail at its first event);
# 8: lifetime policies keep their waste guard (None when off) and its levels buffer
# (a v7 pool would fail at its first placement); 9: lifetime policies keep their
# stranding cost (None when off) and LAS may be its subclass with the pool's
# request mix (a v8 pool would fail at its first placement); 10: the decision
# core's classes live in lavad.core (a v9 snapshot names them under lavad.daemon);
# 11: four lifetime models left the product (the tables and shrunk tables
# recalibrated, the frailty on the tables and on the mixture), so a v10 pool may
# hold a model no configuration can name any more; 12: the lifetime tracker's
# packed per-slot and per-host arrays live in their own objects (SlotColumns,
# HostColumns); 13: the ml limit choice keeps the job's spread and last peak, and its
# configuration how the settings come from the job's windows; 14: LAS keeps its
# cost tolerance and the lifetime policy its copy (a v13 pool would fail at its
# first placement); 15: the lifetime policy's floors keep, beside each host's
# floor, until when it is the host's exact cost (a v14 pool would fail at its
# first placement); 16: the lifetime policy keeps its floors in sets, one per
# recent thresholds array (``placement.floor_sets``; a v15 pool would fail at
# its first placement); 17: the floor sets keep a cache of their arrays by
# identity (a v16 pool would fail at its first placement); 18: LAS and LAVA run
# under the waste guard by default, so LAVA's guard holds its preference below it
# (a v17 LAVA pool has none, and its configuration no longer matches either);
# 19: LAS's model forgets by default (observations count half after 72 h), so
# its tables hold decayed counts and when they were last aged (a v18 LAS pool's
# counts never decayed, and its configuration no longer matches either); 20: a
# pool carries its quarantine, None unless a defect stopped it (a v19 pool has
# no such field and would fail at its first event); 21: the horizontal scaler
# and the moving-window limits keep their windows' maxima as they go
# (``models.limits.window_max``: a v20 scaler's or window's are plain deques
# and would fail at its next window), and a moving window reads a signal it
# may share with the job's other windows (a v20 window holds its own sums under
# other names); 22: the usage windows still open are kept by end in a heap
# (``models.limits.open_windows``; a v21 aggregator holds them in a dict by key),
# and a shared signal keeps the cumulative histogram its windows read, which a v21
# one has not; 23: LAS and LAVA place under a deployment affinity
# (``core.placement.affinity``; a v22 policy has none, and its configuration no
# longer matches the default); 24: the deployment affinity keeps its levels
# between placements, with the deployment and hosts they mark (a v23 affinity
# has no levels and would fail at its first placement); 25: a pool stamps each host
# joining or leaving a deployment (``ClusterState.deployment_changes``), which the
# affinity's levels follow, with the pool they were marked for (a v24 pool has no
# stamps and would fail at its first placement); 26: a prediction keeps the
# quantiles its LAS thresholds come from, and LAVA's preference the probability
# a VM's class needs and the class of its last prediction (a v25 LAVA pool has
# neither and would fail at its first placement); 27: the stranding cost no
# longer keeps quantiles per row, the prediction carries them (a v26 pool's
# stranding cost holds a cache this one never reads); 28: the request mix keeps a
# fill direction per set of exhausted resources, not one mean (a v27 mix has no
# directions and would fail at its first placement); 29: the waste guard remembers
# each host's waste before a placement (a v28 guard has no memory and would fail
# at its first placement); 30: the migration planner sums the migrations off
# ready hosts in its counters and keeps only the latest drains (a v29 planner's
# per-host list is gone, and its mean would read zero), and a pool's hosts
# carry their VM limit (a v29 cluster has none); 31: a lifetime tracker's
# settings carry its bound on feature groups (a v30 tracker's have none); 32: a
# lifetime model's tables reclaim the rows of groups that no longer count, and
# keep the reclaimed rows and their counts of lookups past the bound (a v31
# model has neither and would fail at its first new group); 33: a lifetime
# policy reads its LAS scorer's tolerance, which a rule may set from the CPU
# the pool strands, instead of keeping a copy (a v32 policy has the copy and
# no rule, and would fail at its first placement); 34: the tolerance rule
# says which hosts' stranding it reads (a v33 rule has no such field and would
# fail at its next sample); 35: a lifetime tracker's settings say whose
# remaining life a host's quantiles are, and the tracker keeps that as a flag
# (a v34 tracker has neither and would fail at its first booking)
SNAPSHOT_VERSION = 35
# The fingerprint of the fields every snapshotted class holds, as
# tests/test_snapshot_layout.py records them: a layout change under the same
# version fails that test, which says how to bump and record.
SNAPSHOT_LAYOUT = "c14b5c0a01d5b1d2"


class SnapshotError(Exception):
    """Snapshots cannot be used: one exists but cannot be loaded, or the store cannot
    hold them; the message says why and what to do."""


@dataclass(slots=True)
class PartitionSnapshot:
    partition: int
    fingerprint: str
    # input topic -> offset of the next record not reflected in ``pools``
    offsets: dict[str, int]
    pools: dict[str, PoolRuntime]


def encode_snapshot(snapshot: PartitionSnapshot) -> tuple[dict[str, Any], bytes]:
    """The header (JSON-able) and the body (``state_codec``) of a snapshot."""
    try:
        body = dumps(snapshot.pools)
    except StateCodecError as exc:
        raise SnapshotError(
            f"partition {snapshot.partition}: cannot write the state as data: {exc}"
        ) from None
    header = {
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "fingerprint": snapshot.fingerprint,
        "partition": snapshot.partition,
        "offsets": snapshot.offsets,
        "pools": sorted(snapshot.pools),
    }
    return header, body


def decode_snapshot(
    where: str, header: Any, body: bytes, partition: int, fingerprint: str
) -> PartitionSnapshot:
    """The snapshot ``header`` and ``body`` hold, or SnapshotError saying why not."""
    if not isinstance(header, dict) or header.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{where}: not a lavad partition snapshot")
    if header.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(
            f"{where}: snapshot format version {header.get('version')!r}, this lavad reads "
            f"{SNAPSHOT_VERSION}; move it away to rebuild the state from the input topics"
        )
    if header.get("fingerprint") != fingerprint:
        raise SnapshotError(
            f"{where}: taken under another engine configuration (policy, seed or hosts "
            f"changed: {header.get('fingerprint')} != {fingerprint}); restore that "
            "configuration, or move the snapshot away to rebuild from the input topics"
        )
    if header.get("partition") != partition:
        raise SnapshotError(f"{where}: holds partition {header.get('partition')!r}")
    if hashlib.sha256(body).hexdigest() != header.get("body_sha256"):
        raise SnapshotError(f"{where}: body does not match its checksum (truncated?)")
    try:
        pools = loads(body)
    except StateCodecError as exc:
        raise SnapshotError(f"{where}: body refused: {exc}") from None
    if (
        not isinstance(pools, dict)
        or sorted(pools) != header.get("pools")
        or not all(isinstance(pool, PoolRuntime) for pool in pools.values())
    ):
        raise SnapshotError(f"{where}: body does not match its header")
    offsets = header.get("offsets")
    if not isinstance(offsets, dict) or not all(
        type(offset) is int and offset >= 0 for offset in offsets.values()
    ):
        raise SnapshotError(f"{where}: header offsets are not offsets")
    return PartitionSnapshot(partition, fingerprint, dict(offsets), pools)


class SnapshotStorage(Protocol):
    """Where partition snapshots live: files (``SnapshotStore``) or a Kafka topic
    (``lavad.daemon.live.snapshot_topic.TopicSnapshotStore``); ``live.snapshot_store``."""

    def save(self, snapshot: PartitionSnapshot) -> int: ...

    def load(self, partition: int, fingerprint: str) -> PartitionSnapshot | None: ...

    def move_aside(self, partition: int) -> Path | str: ...

    def prefetch(self) -> None:
        """Start reading what a coming ``load`` may need (a rebalance is under way)."""

    def settle(self) -> None:
        """The rebalance is over: let go of what ``prefetch`` read and no load used."""

    def close(self) -> None: ...


class SnapshotStore:
    """Snapshots of one consumer group under ``root/<group>/partition-<p>.snapshot``."""

    def __init__(self, root: Path, group: str) -> None:
        """Raises SnapshotError, naming the setting, when the directory cannot be
        made or written: found at start-up, not at the first snapshot, after which
        the daemon would run on with no snapshot to restart from."""
        self.directory = root / group
        try:
            make_writable_folder(self.directory)
        except OSError as exc:
            raise SnapshotError(
                f"live.snapshot_dir {str(root)!r}: {str(self.directory)!r} cannot hold "
                f"snapshots ({exc.strerror or exc})"
            ) from None

    def path(self, partition: int) -> Path:
        return self.directory / f"partition-{partition:05d}.snapshot"

    def save(self, snapshot: PartitionSnapshot) -> int:
        """Write atomically; return the size in bytes.

        Raises SnapshotError naming the object when the state holds something
        that is not data (a type outside lavad, a lambda): such a state could
        not be loaded back, so nothing is written.
        """
        header, body = encode_snapshot(snapshot)
        target = self.path(snapshot.partition)
        temporary = target.with_suffix(".tmp")
        with temporary.open("wb") as file:
            file.write(orjson.dumps(header) + b"\n")
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(target)
        return len(body)

    def load(self, partition: int, fingerprint: str) -> PartitionSnapshot | None:
        """The partition's snapshot, or None when it has none yet."""
        path = self.path(partition)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SnapshotError(f"{path}: cannot be read ({exc.strerror})") from None
        line, _, body = data.partition(b"\n")
        try:
            header: Any = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise SnapshotError(f"{path}: header is not JSON ({exc})") from None
        return decode_snapshot(str(path), header, body, partition, fingerprint)

    def prefetch(self) -> None:
        """Nothing to do: a file is read when it is loaded."""

    def settle(self) -> None:
        """Nothing was prefetched."""

    def close(self) -> None:
        """Nothing to release: every save is already on disk."""

    def move_aside(self, partition: int) -> Path:
        """Rename the partition's snapshot out of the way, kept for inspection; return its path.

        The new name ends in ``.bad-<unix time>``, so a later failure does not
        overwrite an earlier one and ``load`` no longer finds it.
        """
        path = self.path(partition)
        aside = path.with_name(f"{path.name}.bad-{time.time_ns()}")
        path.replace(aside)
        return aside
