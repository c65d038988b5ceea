"""Snapshots as data (daemon/live/state_codec.py): exact round trips, crafted files refused."""

from __future__ import annotations

import collections
import hashlib
import heapq
import itertools
import math
import pickle
import struct
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from live_support import AZURE_SLICE, PROJECT_ROOT

from lavad.core.engine import Engine, HostShape, PoolRuntime
from lavad.core.migrations.lifetimes import PolicyLifetimes
from lavad.core.placement.lava import HostPhase, LavaHosts
from lavad.daemon.live import state_codec
from lavad.daemon.live.snapshots import (
    SNAPSHOT_FORMAT,
    SNAPSHOT_VERSION,
    PartitionSnapshot,
    SnapshotError,
    SnapshotStore,
)
from lavad.daemon.live.state_codec import Registry, StateCodecError, default_registry, dumps, loads
from lavad.daemon.settings import Settings, load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord, encode
from lavad.streams.schema import Event, UsageSample, VmRequest

GOOGLE_SLICE = PROJECT_ROOT / "data" / "google-2011-gcd-slice"


def _settings() -> Settings:
    """Limits on (the default), 62 fixed hosts the slice fills past 75%: the defragmenter
    drains hosts and moves VMs, so the planner holds queues, migrations and lifetimes."""
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    return settings.model_copy(
        update={
            "hosts": settings.hosts.model_copy(update={"count": 62, "grow_on_demand": False}),
            "migrations": replace(
                settings.migrations, defrag=replace(settings.migrations.defrag, empty_below=0.25)
            ),
        }
    )


def _events(count: int) -> list[Event]:
    """The Azure slice's first ``count`` events, with measured CPU usage for 16 of its VMs.

    The Azure V1 VM table has no usage, so the Google 2011 per-job series (real
    5-minute CPU and memory fractions) are attributed to the slice's first 16
    requested VMs, shifted to start with the slice: GPA then packs on measured
    usage and the limit recommenders decide, both from real series.
    """
    azure = [
        item
        for item in itertools.islice(open_trace(AZURE_SLICE, seed=0, pool="east").events(), count)
        if not isinstance(item, BadRecord)
    ]
    start, end = azure[0].time, azure[-1].time
    vms = [event.vm_id for event in azure if isinstance(event, VmRequest)][:16]
    google = [
        item for item in open_trace(GOOGLE_SLICE, seed=0).events() if isinstance(item, UsageSample)
    ]
    jobs = sorted({sample.vm_id for sample in google})
    usage = [
        replace(sample, pool="east", vm_id=vms[jobs.index(sample.vm_id)], time=start + sample.time)
        for sample in google
        if start + sample.time <= end
    ]
    return list(heapq.merge(azure, usage, key=lambda event: event.time))


def _decide(engine: Engine, events: list[Event]) -> list[bytes]:
    out: list[bytes] = []
    for event in events:
        out.extend(encode(decision) for decision in engine.handle(event, event.time).decisions)
    return out


@pytest.fixture(scope="module")
def events() -> list[Event]:
    return _events(6_000)


@pytest.mark.parametrize("policy", ["bestfit", "las", "lava", "gpa"])
def test_a_restored_engine_decides_byte_for_byte_as_the_one_that_ran_on(
    policy: str, events: list[Event], tmp_path: Path
) -> None:
    config = _settings().engine_config(policy, trace_has_hosts=False)
    half = len(events) // 2
    engine = Engine(config)
    _decide(engine, events[:half])
    store = SnapshotStore(tmp_path, "group")
    store.save(PartitionSnapshot(0, engine.fingerprint, {"t": half}, dict(engine.pools)))
    restored = Engine(config)
    loaded = store.load(0, restored.fingerprint)
    assert loaded is not None
    restored.adopt_pools(loaded.pools)

    after = _decide(engine, events[half:])
    assert _decide(restored, events[half:]) == after
    kinds = collections.Counter(orjson.loads(line)["kind"] for line in after)
    assert kinds["placement"] and kinds["limit"] and kinds["migration"], kinds
    end = events[-1].time + 86_400.0
    assert [encode(d) for d in restored.advance(end)] == [encode(d) for d in engine.advance(end)]
    assert restored.summary(end) == engine.summary(end)


def test_objects_shared_by_two_owners_stay_one_object(events: list[Event]) -> None:
    engine = Engine(_settings().engine_config("lava", trace_has_hosts=False))
    _decide(engine, events[:2_000])
    pools: dict[str, PoolRuntime] = loads(dumps(engine.pools))
    pool = pools["east"]
    hooks, planner = pool.policy.hooks, pool.migrations
    assert isinstance(hooks, LavaHosts)
    assert planner is not None and isinstance(planner.lifetimes, PolicyLifetimes)
    assert planner.lifetimes.tracker is hooks.tracker
    assert pool.cluster is not engine.pools["east"].cluster


def test_values_come_back_as_the_same_types() -> None:
    generator = np.random.default_rng([7, 11])
    generator.random(5)  # mid-stream
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    shape = HostShape(48.0, 192.0)
    value = {
        "floats": [math.inf, -math.inf, -0.0, 1e-300],
        "nan": math.nan,
        "big": [2**127 + 3, -(2**70)],
        "counter": collections.Counter({"a": 2, ("b", 1): 3}),
        "deque": collections.deque([1, 2, 3], maxlen=4),
        "defaults": collections.defaultdict(list, {"x": [1]}),
        "keys": {1: "int", 2.5: "float", ("t", 1): "tuple", None: "none"},
        "enum": {HostPhase(2): [HostPhase(1)]},
        "sets": ({1, 2}, frozenset({"a"})),
        "numpy": (np.float32(1.5), np.int64(-3), np.bool_(True)),
        "array": np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],
        "empty": np.zeros((0, 4)),
        "shape": (shape, shape),
        "cyclic": cyclic,
        "generator": generator,
        "bytes": b"\x00\xff",
    }
    back = loads(dumps(value))
    assert back["floats"] == value["floats"] and math.copysign(1.0, back["floats"][2]) == -1.0
    assert math.isnan(back["nan"])
    assert back["big"] == value["big"]
    assert type(back["counter"]) is collections.Counter and back["counter"] == value["counter"]
    assert back["deque"] == value["deque"] and back["deque"].maxlen == 4
    assert back["defaults"]["new"] == [] and back["defaults"]["x"] == [1]
    assert back["keys"] == value["keys"]
    assert [(type(k), k, type(v[0])) for k, v in back["enum"].items()] == [
        (HostPhase, HostPhase(2), HostPhase)
    ]
    assert back["sets"] == value["sets"] and type(back["sets"]) is tuple
    assert [type(x) for x in back["numpy"]] == [np.float32, np.int64, np.bool_]
    assert back["numpy"] == value["numpy"]
    np.testing.assert_array_equal(back["array"], value["array"])
    assert back["array"].dtype == np.int16 and back["array"].flags.writeable
    assert back["empty"].shape == (0, 4)
    assert back["shape"][0] == shape and back["shape"][0] is back["shape"][1]
    assert back["cyclic"][1] is back["cyclic"]
    assert back["generator"].random(3).tolist() == generator.random(3).tolist()
    assert back["bytes"] == value["bytes"]


def test_a_state_holding_code_is_not_saved_and_the_error_names_where(tmp_path: Path) -> None:
    with pytest.raises(StateCodecError, match=r"state\['pool'\]\[1\].*lambda"):
        dumps({"pool": [1, lambda: 0]})
    with pytest.raises(StateCodecError, match=r"state\[0\]: pathlib.*PosixPath"):
        dumps([Path("/")])
    with pytest.raises(StateCodecError, match="dtype object"):
        dumps(np.array([None]))
    engine = Engine(_settings().engine_config("bestfit", trace_has_hosts=False))
    _decide(engine, _events(50))
    engine.pools["east"].counters["x"] = print  # type: ignore[assignment]
    store = SnapshotStore(tmp_path, "group")
    with pytest.raises(SnapshotError, match=r"\['east'\]\.counters\['x'\].*builtins.print"):
        store.save(PartitionSnapshot(0, engine.fingerprint, {}, dict(engine.pools)))
    assert not store.path(0).exists()


# ------------------------------------------------------------------ crafted files


class _OpensAFile:
    """A pickle payload: unpickling it calls ``open(marker, "w")``, creating the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def _write(store: SnapshotStore, body: bytes, *, version: int = SNAPSHOT_VERSION) -> None:
    header = {
        # An attacker who can write the file can also recompute the checksum.
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "format": SNAPSHOT_FORMAT,
        "version": version,
        "fingerprint": "f",
        "partition": 0,
        "offsets": {"lavad.vm-events": 0},
        "pools": ["east"],
    }
    store.path(0).write_bytes(orjson.dumps(header) + b"\n" + body)


def _codec_body(tree: Any, blob: bytes = b"") -> bytes:
    structure = orjson.dumps(tree)
    return struct.pack("<Q", len(structure)) + structure + blob


def test_an_old_pickle_snapshot_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"east": _OpensAFile(marker)})
    store = SnapshotStore(tmp_path, "group")
    _write(store, payload, version=3)
    with pytest.raises(SnapshotError, match="format version 3"):
        store.load(0, "f")
    _write(store, payload)  # the same pickle under the current version
    with pytest.raises(SnapshotError, match="body refused"):
        store.load(0, "f")
    assert not marker.exists()


CRAFTED = [
    # A class from outside lavad, named as an object, a class, a function, an enum.
    (["D", {"east": ["o", "os.system", {}]}], "'os.system' is not an allowed lavad type"),
    (["D", {"east": ["T", "builtins.eval"]}], "'builtins.eval' is not an allowed lavad type"),
    (["D", {"east": ["fn", "builtins.open"]}], "'builtins.open' is not a lavad function"),
    (["D", {"east": ["e", "subprocess.Popen", "ls"]}], "'subprocess.Popen' is not an allowed"),
    (["D", {"east": ["g", "os.system", {}]}], "bit generator 'os.system' is not allowed"),
    # A lavad class, but a field that would rebind the instance's class.
    (
        [
            "D",
            {"east": ["o", "lavad.core.engine.HostShape", {"__class__": ["T", "builtins.str"]}]},
        ],
        "field name '__class__' refused",
    ),
    (
        ["D", {"east": ["o", "lavad.core.engine.HostShape", {"colour": 1}]}],
        "HostShape has no field 'colour'",
    ),
    # Arrays of Python objects (np.load's pickle path) and bytes past the end.
    (["D", {"east": ["a", "|O", [1], 0, 8]}], "dtype '|O' is not plain data"),
    (["D", {"east": ["a", "<f8", [4], 0, 32]}], "past the end"),
    (["D", {"east": ["r", 5]}], "reference 5 to an object not yet read"),
    (["D", {"east": ["x", 1]}], "unknown tag 'x'"),
]


@pytest.mark.parametrize(("tree", "reason"), CRAFTED)
def test_a_crafted_snapshot_is_refused_with_the_reason(
    tree: Any, reason: str, tmp_path: Path
) -> None:
    store = SnapshotStore(tmp_path, "group")
    _write(store, _codec_body(tree))
    with pytest.raises(SnapshotError, match="body refused") as refused:
        store.load(0, "f")
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00" * 3, struct.pack("<Q", 10**6) + b"[]", _codec_body(["l", []])[:-1], b"\xff" * 64],
)
def test_a_garbage_body_is_refused(body: bytes, tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "group")
    _write(store, body)
    with pytest.raises(SnapshotError, match="body refused"):
        store.load(0, "f")


def test_a_body_that_is_not_pools_is_refused(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "group")
    _write(store, _codec_body(["D", {"east": ["o", "lavad.core.engine.HostShape", {}]}]))
    with pytest.raises(SnapshotError, match="does not match its header"):
        store.load(0, "f")


@pytest.mark.parametrize("header", [b"[]", b"null", b"\x80\x05", b""])
def test_a_header_that_is_not_a_snapshot_header_is_refused(header: bytes, tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "group")
    store.path(0).write_bytes(header + b"\n")
    with pytest.raises(SnapshotError):
        store.load(0, "f")


def _nested_body(depth: int) -> bytes:
    """Tuples in tuples, ``depth`` deep, as text (orjson writes no deeper than 255)."""
    structure = b'["D",{"east":' + b'["t",[' * depth + b"1" + b"]]" * depth + b"}]"
    return struct.pack("<Q", len(structure)) + structure


# Absurd values from a crafted file: each is refused by the work it costs, not by a
# crash or an allocation sized by the value.
ABSURD = [
    (_nested_body(508), "nested too deeply"),
    (_nested_body(5_000), "not JSON"),  # past orjson's own depth limit
    (_codec_body(["D", {"east": ["I", "9" * 100_000]}]), "does not describe a state"),
    (_codec_body(["D", {"east": ["a", "<f8", [10**12, 10**12], 0, 8]}]), "size does not match"),
]


@pytest.mark.parametrize(("body", "reason"), ABSURD)
def test_absurd_values_in_a_snapshot_are_refused(body: bytes, reason: str, tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "group")
    _write(store, body)
    with pytest.raises(SnapshotError, match="body refused") as refused:
        store.load(0, "f")
    assert reason in str(refused.value)


def test_threads_asking_for_the_registry_at_once_share_one_walk() -> None:
    # The daemon walks lavad's modules in a thread while it joins its group; a
    # snapshot loaded meanwhile asks from the event loop's thread. Without the
    # lock each caller would walk for itself and get a registry of its own.
    state_codec._walked_registry.cache_clear()
    start = threading.Barrier(2)
    found: list[Registry] = []

    def ask() -> None:
        start.wait()
        found.append(default_registry())

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 2 and found[0] is found[1]
    assert found[0] is default_registry()
    assert "lavad.core.placement.lava.LavaHosts" in found[0].classes
