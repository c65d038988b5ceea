"""Trace adapters against the real traces: counts, order, censoring, lifetimes, errors.

Expected numbers are computed here from the raw file text, independently of
the adapters (token counts, ``C`` tokens, CSV rows), so a test fails when an
adapter drops, duplicates or misreads a record. The shipped slices in
``data/`` always run; the full traces in ``../shared/data`` run when present.
"""

from __future__ import annotations

import csv
import dataclasses
import gc
import itertools
import math
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson
import pytest

from lavad.streams.adapters import (
    FORMATS,
    Trace,
    TraceFormatError,
    TraceItem,
    TraceOptionError,
    detect_format,
    open_trace,
)
from lavad.streams.adapters.azure_vms import read_batch_buckets
from lavad.streams.adapters.base import pick_listed
from lavad.streams.adapters.usage import _natural
from lavad.streams.codec import BadRecord
from lavad.streams.fastbuild import fast_constructor
from lavad.streams.schema import (
    MAX_USAGE,
    DeploymentArrival,
    DeploymentScaleIn,
    DeploymentScaleOut,
    Event,
    HostUp,
    UsageSample,
    UsageStats,
    VmExit,
    VmRequest,
)
from lavad.streams.trace_tools import convert, trace_info

ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = ROOT / "data" / "azure-v1-vms-slice"
OPENB_SLICE = ROOT / "data" / "alibaba-openb-slice"
AZURE_T = 2_100_000.0
OPENB_END = 12_902_960.0
EPS = 1e-6


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC in tests that hold whole traces in lists.

    Half a million retained events (none in a reference cycle) make every
    full collection rescan them; pausing it halves these tests' time.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# ----------------------------------------------------------- raw-text oracles


class RawVm(NamedTuple):
    vm_id: str
    line: int
    stamp: float
    prev: float
    flavor: str
    duration: str
    batch: int
    batch_size: int


def raw_azure(arrivals: Path, durations: Path) -> list[RawVm]:
    """Every VM token of an Azure V1 split, read straight from the text."""
    vms: list[RawVm] = []
    prev: float | None = None
    a_lines = arrivals.read_text().splitlines()
    d_lines = durations.read_text().splitlines()
    assert len(a_lines) == len(d_lines)
    for lineno, (a_line, d_line) in enumerate(zip(a_lines, d_lines, strict=True), start=1):
        stamp_text, a_rest = a_line.split(" ", 1)
        _, d_rest = d_line.split(" ", 1)
        stamp = float(stamp_text)
        start = stamp - 300 if prev is None else prev
        prev = stamp
        batches: list[list[tuple[str, str]]] = [[]]
        for flavor, duration in zip(a_rest.split(","), d_rest.split(","), strict=True):
            if flavor == "|":
                batches.append([])
            else:
                batches[-1].append((flavor, duration))
        pos = 0
        for b, batch in enumerate(batches):
            for flavor, duration in batch:
                vms.append(
                    RawVm(
                        f"az-{lineno}-{pos}",
                        lineno,
                        stamp,
                        start,
                        flavor,
                        duration,
                        b,
                        len(batch),
                    )
                )
                pos += 1
    return vms


def raw_flavors(directory: Path) -> dict[str, tuple[float, float]]:
    out = {}
    for line in (directory / "flav_map.txt").read_text().split("\n"):
        if line.strip():
            shape, letter = line.split()
            cores, memory = shape.split(",")
            out[letter] = (float(cores), float(memory))
    return out


def raw_bins(directory: Path) -> list[tuple[float, float]]:
    """[lo, hi) per lifetime bin: lo = first duration mapped to it, hi = next bin's lo."""
    lows: dict[int, float] = {}
    for line in (directory / "v1.interval_map.txt").read_text().split("\n"):
        if line.strip():
            seconds, index = line.split()
            lows.setdefault(int(index), float(seconds))
    ordered = [lows[b] for b in sorted(lows)]
    return [
        (lo, ordered[b + 1] if b + 1 < len(ordered) else math.inf) for b, lo in enumerate(ordered)
    ]


def _count_censored(durations: Path) -> int:
    """C tokens in a duration file, counted on the raw text."""
    text = durations.read_text()
    return sum(t.startswith("C") for line in text.splitlines() for t in line.split()[1].split(","))


def events_only(items: list[TraceItem]) -> list[Event]:
    return [item for item in items if not isinstance(item, BadRecord)]


def assert_time_ordered(items: list[TraceItem]) -> None:
    times = [e.time for e in events_only(items)]
    assert all(a <= b for a, b in itertools.pairwise(times))


def assert_exits_follow_requests(items: list[TraceItem]) -> None:
    requested: dict[str, int] = {}
    for i, item in enumerate(items):
        if isinstance(item, VmRequest):
            assert item.vm_id not in requested, f"duplicate request {item.vm_id}"
            requested[item.vm_id] = i
        elif isinstance(item, VmExit):
            assert requested.get(item.vm_id, len(items)) < i, f"{item.vm_id} exits first"


def check_azure(items: list[TraceItem], directory: Path, raw: list[RawVm]) -> None:
    """Everything the Azure adapter promises, checked against the raw tokens."""
    assert not [i for i in items if isinstance(i, BadRecord)]
    assert_time_ordered(items)
    assert_exits_follow_requests(items)
    flavors = raw_flavors(directory)
    bins = raw_bins(directory)
    requests = [e for e in items if isinstance(e, VmRequest)]
    exits = {e.vm_id: e for e in items if isinstance(e, VmExit)}
    assert [r.vm_id for r in requests] == [v.vm_id for v in raw]
    uncensored = {v.vm_id for v in raw if v.duration.startswith("U")}
    assert set(exits) == uncensored  # C VMs never exit; U VMs always do
    assert len(exits) == sum(v.duration.startswith("U") for v in raw)
    # Whole-list comparisons (fast enough for the full 259k-VM split).
    times = np.array([r.time for r in requests])
    assert np.all(np.array([v.prev for v in raw]) < times)
    assert np.all(times <= np.array([v.stamp for v in raw]))
    assert [(r.cores, r.memory_gib) for r in requests] == [flavors[v.flavor] for v in raw]
    assert [r.flavor for r in requests] == [v.flavor for v in raw]
    names = [f"{v.stamp:.0f}-{v.batch}" for v in raw]
    assert [r.deployment for r in requests] == names
    assert [r.tenant for r in requests] == names
    assert [r.features for r in requests] == [
        {"batch_size": v.batch_size, "hour_of_day": int(r.time // 3600) % 24}
        for r, v in zip(requests, raw, strict=True)
    ]
    done = [i for i, v in enumerate(raw) if v.duration.startswith("U")]
    bounds = np.array([bins[int(raw[i].duration[1:])] for i in done])
    arrive = times[done]
    leave = np.array([exits[raw[i].vm_id].time for i in done])
    life = leave - arrive
    assert np.all(leave <= AZURE_T)
    assert np.all(bounds[:, 0] - EPS <= life)
    assert np.all(life < np.minimum(bounds[:, 1], AZURE_T - arrive) + EPS)


# --------------------------------------------------------------------- Azure


def test_formats_detected_on_slices() -> None:
    assert detect_format(AZURE_SLICE) == "azure-v1-vms"
    assert detect_format(AZURE_SLICE / "v1.devhead.txt") == "azure-v1-vms"
    assert detect_format(AZURE_SLICE / "v1.devhead.c2100000.txt") == "azure-v1-vms"
    assert detect_format(OPENB_SLICE) == "alibaba-openb"
    assert detect_format(OPENB_SLICE / "openb_pod_list_default.csv") == "alibaba-openb"
    assert set(FORMATS) >= {"azure-v1-vms", "alibaba-openb", "alibaba-dlrm", "jsonl"}


@pytest.mark.usefixtures("no_gc")
def test_azure_slice_matches_raw_text() -> None:
    trace = open_trace(AZURE_SLICE)
    assert trace.name == "azure-v1-vms"
    assert trace.end_time == AZURE_T
    assert trace.describe()["split"] == "devhead"  # any split name works
    assert not trace.has_hosts
    items = list(trace.events())
    raw = raw_azure(AZURE_SLICE / "v1.devhead.txt", AZURE_SLICE / "v1.devhead.c2100000.txt")
    text = (AZURE_SLICE / "v1.devhead.txt").read_text()
    tokens = [t for line in text.splitlines() for t in line.split(" ", 1)[1].split(",")]
    censored = _count_censored(AZURE_SLICE / "v1.devhead.c2100000.txt")
    assert len(raw) == sum(t != "|" for t in tokens) == 46_214
    assert sum(v.duration.startswith("C") for v in raw) == censored == 688
    check_azure(items, AZURE_SLICE, raw)
    first = items[0]
    assert isinstance(first, VmRequest)
    assert first.vm_id == "az-1-0"
    assert first.flavor == text.split(" ", 1)[1].split(",")[0]
    # The first line's VMs are spread evenly over (1,799,700, 1,800,000].
    line1 = [e for e in items if isinstance(e, VmRequest) and e.vm_id.startswith("az-1-")]
    gaps = {round(b.time - a.time, 6) for a, b in itertools.pairwise(line1)}
    assert gaps == {round(300 / len(line1), 6)}
    assert line1[-1].time == 1_800_000.0


def test_azure_same_seed_same_events_other_seed_other_lifetimes(tmp_path: Path) -> None:
    directory = _copy_slice(tmp_path, lines=60)
    first = list(open_trace(directory, seed=7).events())
    again = list(open_trace(directory, seed=7).events())
    other = list(open_trace(directory, seed=8).events())
    assert first == again
    assert [e for e in first if isinstance(e, VmRequest)] == [
        e for e in other if isinstance(e, VmRequest)
    ]
    exits_a = {e.vm_id: e.time for e in first if isinstance(e, VmExit)}
    exits_b = {e.vm_id: e.time for e in other if isinstance(e, VmExit)}
    assert exits_a.keys() == exits_b.keys()
    assert sum(exits_a[k] != exits_b[k] for k in exits_a) > 0.9 * len(exits_a)


def _copy_slice(tmp_path: Path, split: str = "devhead", lines: int | None = None) -> Path:
    """A copy of the Azure slice, optionally cut to its first ``lines`` lines (speed)."""
    target = tmp_path / "azure"
    shutil.copytree(AZURE_SLICE, target)
    if lines is not None:
        for name in ("v1.devhead.txt", "v1.devhead.c2100000.txt"):
            kept = (target / name).read_bytes().split(b"\n")[:lines]
            (target / name).write_bytes(b"\n".join(kept) + b"\n")
    if split != "devhead":
        (target / "v1.devhead.txt").rename(target / f"v1.{split}.txt")
        (target / "v1.devhead.c2100000.txt").rename(target / f"v1.{split}.c2100000.txt")
    return target


@pytest.mark.parametrize(
    ("listed", "name", "default", "picked"),
    [
        # A name picks its file, whatever else is listed or defaulted.
        ({"a": "a.csv", "b": "b.csv"}, "b", "a", ("b", "b.csv")),
        # No name: the default when listed...
        ({"a": "a.csv", "default": "d.csv"}, None, "default", ("default", "d.csv")),
        # ...else the only file...
        ({"a": "a.csv"}, None, "default", ("a", "a.csv")),
        # ...else no choice: the adapter says how to make one.
        ({"a": "a.csv", "b": "b.csv"}, None, "default", None),
        ({}, None, None, None),
    ],
)
def test_pick_listed(
    listed: dict[str, str], name: str | None, default: str | None, picked: tuple[str, str] | None
) -> None:
    files = {key: Path(value) for key, value in listed.items()}
    expected = None if picked is None else (picked[0], Path(picked[1]))
    assert pick_listed(Path("trace"), files, name, what="list", default=default) == expected


def test_pick_listed_unknown_name() -> None:
    with pytest.raises(TraceOptionError, match=r"no list 'c' here; found \['a', 'b'\]"):
        pick_listed(Path("trace"), {"a": Path("a"), "b": Path("b")}, "c", what="list")


def test_azure_split_detection(tmp_path: Path) -> None:
    directory = _copy_slice(tmp_path)
    shutil.copy(directory / "v1.devhead.txt", directory / "v1.other.txt")
    shutil.copy(directory / "v1.devhead.c2100000.txt", directory / "v1.other.c1900000.txt")
    with pytest.raises(TraceFormatError, match=r"2 splits \['devhead', 'other'\]") as info:
        open_trace(directory)
    assert "v1.devhead.txt" in str(info.value)  # it names a file to pass instead
    assert open_trace(directory / "v1.other.txt").end_time == 1_900_000.0
    assert open_trace(directory, split="devhead").end_time == AZURE_T
    with pytest.raises(TraceOptionError, match="no split 'nope'"):
        open_trace(directory, split="nope")
    with pytest.raises(TraceOptionError, match="unknown option"):
        open_trace(directory / "v1.other.txt", view="vms")
    (directory / "v1.other.c1900000.txt").unlink()
    with pytest.raises(TraceFormatError, match="exactly one duration file"):
        open_trace(directory / "v1.other.txt")
    with pytest.raises(TraceFormatError, match="no such file"):
        open_trace(tmp_path / "missing")
    with pytest.raises(TraceFormatError, match="matches no known trace format"):
        open_trace(directory / "LICENSE")


def test_azure_malformed_lines_become_bad_records(tmp_path: Path) -> None:
    directory = _copy_slice(tmp_path, lines=40)
    clean = list(open_trace(directory).events())
    arrivals = directory / "v1.devhead.txt"
    lines = arrivals.read_bytes().split(b"\n")
    stamp, rest = lines[4].split(b" ", 1)
    lines[4] = stamp + b" z" + rest[1:]  # line 5: unknown flavor 'z'
    lines[9] = lines[9] + b",g"  # line 10: one arrival more than durations
    arrivals.write_bytes(b"\n".join(lines))
    items = list(open_trace(directory).events())
    bad = [i for i in items if isinstance(i, BadRecord)]
    assert [(b.position, b.raw) for b in bad] == [("line 5", lines[4]), ("line 10", lines[9])]
    assert "unknown flavor 'z'" in bad[0].reason
    assert "duration tokens" in bad[1].reason
    assert bad[0].source == str(arrivals)
    # The stream goes on, and (one generator per line, bins still closed by
    # the bad lines' stamps) nothing else changes.
    original = clean
    skipped = ("az-5-", "az-10-")
    expected = [e for e in original if not getattr(e, "vm_id", "").startswith(skipped)]
    assert events_only(items) == expected
    # A line whose stamp is unreadable is reported too; the stream still goes on.
    lines[14] = b"oops " + lines[14].split(b" ", 1)[1]
    arrivals.write_bytes(b"\n".join(lines))
    items = list(open_trace(directory).events())
    bad = [i for i in items if isinstance(i, BadRecord)]
    assert [b.position for b in bad] == ["line 5", "line 10", "line 15"]
    assert "time stamp 'oops'" in bad[2].reason
    assert_time_ordered(items)
    assert sum(isinstance(e, VmRequest) for e in items) == sum(
        isinstance(e, VmRequest) and not e.vm_id.startswith(("az-5-", "az-10-", "az-15-"))
        for e in original
    )


def test_azure_short_duration_file_is_reported(tmp_path: Path) -> None:
    directory = _copy_slice(tmp_path, lines=30)
    durations = directory / "v1.devhead.c2100000.txt"
    durations.write_text("\n".join(durations.read_text().splitlines()[:28]) + "\n")
    items = list(open_trace(directory).events())
    bad = [i for i in items if isinstance(i, BadRecord)]
    assert [b.position for b in bad] == ["line 29", "line 30"]
    assert all("no matching line in the duration file" in b.reason for b in bad)
    assert_time_ordered(items)


def test_azure_irregular_stamps_and_any_split_name(tmp_path: Path) -> None:
    """Stamps off the 300 s grid and gaps between lines: order and bounds still hold.

    The rows are real ones (lines 1-6 of the slice) re-stamped, to exercise
    windows that do not align with the exit calendar's 300 s buckets.
    """
    directory = _copy_slice(tmp_path, split="my.odd-split", lines=6)
    stamps = [b"450", b"700", b"701", b"1900", b"4000", b"4333"]
    for name in ("v1.my.odd-split.txt", "v1.my.odd-split.c2100000.txt"):
        path = directory / name
        rows = path.read_bytes().splitlines()
        path.write_bytes(
            b"\n".join(s + b" " + r.split(b" ", 1)[1] for s, r in zip(stamps, rows, strict=True))
        )
    trace = open_trace(directory)
    assert trace.describe()["split"] == "my.odd-split"
    items = list(trace.events())
    raw = raw_azure(directory / "v1.my.odd-split.txt", directory / "v1.my.odd-split.c2100000.txt")
    check_azure(items, directory, raw)
    assert raw[0].prev == 150.0  # the first line's bin is (t - 300, t]


# --------------------------------------------------------------------- OpenB


def _raw_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def check_openb(items: list[TraceItem], directory: Path, pods_file: Path) -> None:
    nodes = _raw_csv(directory / "openb_node_list_all_node.csv")
    pods = _raw_csv(pods_file)
    hosts = [e for e in items if isinstance(e, HostUp)]
    assert len(hosts) == len(nodes) == 1523
    assert items[: len(hosts)] == hosts  # hosts first, before any pod
    assert [h.host_id for h in hosts] == [n["sn"] for n in nodes]
    for host, node in zip(hosts, nodes, strict=True):
        assert host.time == 0.0
        assert host.cores == int(node["cpu_milli"]) / 1000
        assert host.memory_gib == int(node["memory_mib"]) / 1024
        assert host.gpus == int(node["gpu"])
        assert host.labels == ({"model": node["model"]} if node["model"] else {})
    requests = {e.vm_id: e for e in items if isinstance(e, VmRequest)}
    exits = {e.vm_id: e for e in items if isinstance(e, VmExit)}
    assert len(requests) == len(pods)  # pending pods request too
    assert set(exits) == {p["name"] for p in pods if float(p["deletion_time"]) != OPENB_END}
    for pod in pods:
        request = requests[pod["name"]]
        assert request.time == float(pod["creation_time"])
        assert request.cores == int(pod["cpu_milli"]) / 1000
        assert request.memory_gib == int(pod["memory_mib"]) / 1024
        assert request.gpus == int(pod["num_gpu"]) * int(pod["gpu_milli"]) / 1000
        assert request.features == {"qos": pod["qos"], "gpu_spec": pod["gpu_spec"]}
        if pod["name"] in exits:
            assert exits[pod["name"]].time == float(pod["deletion_time"])
    assert_time_ordered(items)
    assert_exits_follow_requests(items)


def test_openb_slice_matches_raw_csv() -> None:
    trace = open_trace(OPENB_SLICE)
    assert trace.name == "alibaba-openb"
    assert trace.end_time == OPENB_END
    assert trace.has_hosts
    items = list(trace.events())
    assert not [i for i in items if isinstance(i, BadRecord)]
    check_openb(items, OPENB_SLICE, OPENB_SLICE / "openb_pod_list_default.csv")
    first_pod = items[1523]
    assert isinstance(first_pod, VmRequest)
    assert (first_pod.vm_id, first_pod.time, first_pod.cores) == ("openb-pod-0000", 0.0, 12.0)
    pods = _raw_csv(OPENB_SLICE / "openb_pod_list_default.csv")
    pending = {p["name"] for p in pods if not p["scheduled_time"]}
    assert len(pods) == 2500
    assert len(pending) == 199
    assert pending <= {e.vm_id for e in items if isinstance(e, VmRequest)}
    info = trace_info(OPENB_SLICE)
    assert info["hosts"] == 1523
    assert info["censored_vms"] == 21  # deletion_time == trace end in the slice


def test_openb_unsorted_and_malformed_rows(tmp_path: Path) -> None:
    directory = tmp_path / "openb"
    directory.mkdir()
    shutil.copy(OPENB_SLICE / "openb_node_list_all_node.csv", directory)
    lines = (OPENB_SLICE / "openb_pod_list_default.csv").read_bytes().splitlines()
    header, rows = lines[0], lines[1:]
    rows.reverse()  # creation times now descend: the adapter must sort
    rows[10] = rows[10].replace(b",", b",abc,", 1)  # one cell too many
    rows[20] = b"openb-pod-x,-5,1,0,0,,LS,Running,3,4,3"  # negative CPU
    (directory / "openb_pod_list_x.csv").write_bytes(b"\n".join([header, *rows]) + b"\n")
    items = list(open_trace(directory).events())  # one pod list, not 'default': taken
    bad = [i for i in items if isinstance(i, BadRecord)]
    by_line = {b.position: b for b in bad}
    assert set(by_line) == {"line 12", "line 22"}
    assert "cpu_milli: must be > 0" in by_line["line 22"].reason
    assert by_line["line 22"].raw == rows[20]
    assert_time_ordered(items)
    assert_exits_follow_requests(items)
    assert sum(isinstance(e, VmRequest) for e in items) == 2498  # 2 bad of 2,500


def test_openb_empty_and_repeated_ids_are_dead_lettered(tmp_path: Path) -> None:
    directory = tmp_path / "openb"
    directory.mkdir()
    nodes = (OPENB_SLICE / "openb_node_list_all_node.csv").read_bytes().splitlines()
    nodes[2] = b"," + nodes[2].split(b",", 1)[1]  # no host id
    nodes[3] = nodes[1]  # the first host again
    (directory / "openb_node_list_all_node.csv").write_bytes(b"\n".join(nodes) + b"\n")
    pods = (OPENB_SLICE / "openb_pod_list_default.csv").read_bytes().splitlines()
    pods[5] = b"  " + pods[5][pods[5].index(b",") :]  # a blank pod name
    pods[6] = pods[1]  # the first pod again
    (directory / "openb_pod_list_default.csv").write_bytes(b"\n".join(pods) + b"\n")
    items = list(open_trace(directory).events())
    reasons = sorted(i.reason for i in items if isinstance(i, BadRecord))
    first_host = nodes[1].split(b",")[0].decode()
    first_pod = pods[1].split(b",")[0].decode()
    assert reasons == sorted(
        [
            "sn: empty host id",
            f"sn: duplicate host id {first_host!r}",
            "name: empty pod name",
            f"name: duplicate pod name {first_pod!r}",
        ]
    )
    # Each repeated id keeps its first row: one host and one pod fewer, not two.
    assert sum(isinstance(e, HostUp) for e in items) == len(nodes) - 3
    assert sum(isinstance(e, VmRequest) for e in items) == len(pods) - 3


def test_openb_options(tmp_path: Path) -> None:
    alone = open_trace(OPENB_SLICE, hosts=False)
    assert not alone.has_hosts
    assert not any(isinstance(e, HostUp) for e in alone.events())
    with pytest.raises(TraceOptionError, match="no pod list 'cpu050'"):
        open_trace(OPENB_SLICE, pods="cpu050")
    shutil.copy(OPENB_SLICE / "openb_pod_list_default.csv", tmp_path)
    with pytest.raises(TraceFormatError, match="hosts=False"):
        open_trace(tmp_path / "openb_pod_list_default.csv")


# ---------------------------------------------------------- JSON lines, tools


def test_convert_then_read_back_is_identical(tmp_path: Path) -> None:
    azure = _copy_slice(tmp_path, lines=30)
    for source in (azure, OPENB_SLICE):
        original = list(open_trace(source).events())
        out = tmp_path / f"{source.name}.jsonl"
        result = convert(source, out)
        assert int(result) == result.events == len(original)
        assert result.bad_records == 0
        back = open_trace(out)
        assert back.name == "jsonl"
        assert back.has_hosts == (source == OPENB_SLICE)
        assert list(back.events()) == original


def test_jsonl_bad_lines_and_order(tmp_path: Path) -> None:
    good = [
        VmRequest(time=1.0, pool="p", vm_id="a", cores=1.0, memory_gib=1.0),
        VmExit(time=5.0, pool="p", vm_id="a"),
        VmExit(time=2.0, pool="p", vm_id="b"),  # out of order
    ]
    lines = [orjson.dumps(e) for e in good]
    lines.insert(1, b'{"v": 1, "type": "vm.request", "time": 1.5, "pool": "p"}')
    lines.insert(2, b"not json")
    lines.insert(3, b"")
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    items = list(open_trace(path, end_time=9.0).events())
    assert open_trace(path, end_time=9.0).end_time == 9.0
    assert events_only(items) == good[:2]
    bad = [i for i in items if isinstance(i, BadRecord)]
    assert [b.position for b in bad] == ["line 2", "line 3", "line 6"]
    assert "vm_id" in bad[0].reason  # SchemaError's text names the field
    assert "not valid JSON" in bad[1].reason
    assert "out of order" in bad[2].reason
    assert bad[1].raw == b"not json"


def test_jsonl_line_that_is_not_utf8_is_a_bad_record(tmp_path: Path) -> None:
    first = VmRequest(time=1.0, pool="p", vm_id="a", cores=1.0, memory_gib=1.0)
    last = VmExit(time=5.0, pool="p", vm_id="a")
    broken = orjson.dumps(VmRequest(time=2.0, pool="p", vm_id="b", cores=1.0, memory_gib=1.0))
    broken = broken.replace(b'"b"', b'"\xe2\x82"')  # a three-byte character cut short
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join([orjson.dumps(first), broken, orjson.dumps(last)]) + b"\n")
    items = list(open_trace(path, end_time=9.0).events())
    assert events_only(items) == [first, last]
    (bad,) = [i for i in items if isinstance(i, BadRecord)]
    assert (bad.position, bad.raw) == ("line 2", broken)
    assert "not valid UTF-8" in bad.reason


def test_convert_dead_letters_bad_records(tmp_path: Path) -> None:
    directory = _copy_slice(tmp_path, lines=30)
    arrivals = directory / "v1.devhead.txt"
    lines = arrivals.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b",", b",,", 1)
    arrivals.write_bytes(b"\n".join(lines))
    dead = tmp_path / "bad.jsonl"
    result = convert(directory, tmp_path / "out.jsonl", bad_path=dead)
    assert result.bad_records == 1
    record = orjson.loads(dead.read_bytes())
    assert record["position"] == "line 3"
    info = trace_info(directory)
    assert info["bad_records"] == 1
    assert info["events"] == result.events
    assert info["counts"]["vm.request"] + info["counts"]["vm.exit"] == result.events


def test_trace_info_on_azure_slice() -> None:
    info = trace_info(AZURE_SLICE)
    assert info["format"] == "azure-v1-vms"
    assert info["vms"] == 46_214
    assert info["censored_vms"] == 688
    assert info["counts"] == {"vm.exit": 46_214 - 688, "vm.request": 46_214}
    assert info["end_time"] == AZURE_T
    assert info["hosts"] == 0
    assert info["bad_records"] == 0
    assert info["first_time"] <= info["last_time"] <= AZURE_T
    orjson.dumps(info)  # the CLI prints it as JSON


def test_trace_info_counts_ids_within_their_pool(tmp_path: Path) -> None:
    # The OpenB slice twice, as pools "a" and "b": the same VM and host ids in
    # both are twice as many VMs and hosts, as the engine holds them.
    one = trace_info(OPENB_SLICE)
    converted = tmp_path / "openb.jsonl"
    convert(OPENB_SLICE, converted)
    records = [orjson.loads(line) for line in converted.read_bytes().splitlines()]
    both = tmp_path / "two-pools.jsonl"
    both.write_bytes(
        b"\n".join(orjson.dumps(r | {"pool": pool}) for pool in "ab" for r in records) + b"\n"
    )
    two = trace_info(both)
    assert one["vms"] > 0 and one["hosts"] > 0
    for key in ("vms", "censored_vms", "hosts"):
        assert two[key] == 2 * one[key], key


def test_open_trace_rejects_bad_arguments() -> None:
    with pytest.raises(TraceOptionError, match="seed"):
        open_trace(AZURE_SLICE, seed=-1)
    with pytest.raises(TraceOptionError, match="pool"):
        open_trace(AZURE_SLICE, pool="")
    with pytest.raises(TraceOptionError, match="unknown format"):
        open_trace(AZURE_SLICE, format="nope")
    with pytest.raises(TraceOptionError, match="accepts: hosts, pods"):
        open_trace(OPENB_SLICE, split="x")
    assert isinstance(open_trace(AZURE_SLICE, format="azure-v1-vms"), Trace)


@pytest.mark.parametrize(
    ("cls", "values"),
    [
        (VmExit, {"time": 3.5, "pool": "p", "vm_id": "v"}),
        (
            VmRequest,
            {
                "time": 1.0,
                "pool": "p",
                "vm_id": "v",
                "cores": 2.0,
                "memory_gib": 3.5,
                "tenant": "t",
                "deployment": "d",
                "flavor": "g",
                "features": {"batch_size": 3},
            },
        ),
        (UsageStats, {"mean": 0.25, "peak": 0.5}),
    ],
)
def test_fast_constructor_builds_the_same_object(cls: type, values: dict[str, object]) -> None:
    build = fast_constructor(cls, *values)
    fast = build(*values.values())
    slow = cls(**values)
    assert type(fast) is cls
    assert fast == slow
    if not isinstance(values.get("features"), dict):  # a dict field makes it unhashable
        assert hash(fast) == hash(slow)
    assert repr(fast) == repr(slow)
    assert orjson.dumps(fast) == orjson.dumps(slow)
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fast, next(iter(values)), 0.0)  # frozen like any other
    if cls is VmRequest:  # a left-out default factory runs per object
        short = fast_constructor(cls, "time", "pool", "vm_id", "cores", "memory_gib")
        one, two = short(1.0, "p", "v", 1.0, 1.0), short(1.0, "p", "v", 1.0, 1.0)
        assert one.features == {}
        assert one.features is not two.features


def test_fast_constructor_refuses_what_it_cannot_build() -> None:
    @dataclasses.dataclass
    class Plain:
        x: int

    with pytest.raises(TypeError, match="not a slotted dataclass"):
        fast_constructor(Plain, "x")
    with pytest.raises(TypeError, match="has no default"):
        fast_constructor(VmExit, "time", "pool")


# ------------------------------------------------------ full traces (shared)


def _need(shared_data: Path, name: str) -> Path:
    folder = shared_data / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    return folder


@pytest.mark.shared_data
@pytest.mark.usefixtures("no_gc")
def test_azure_full_dev_split(shared_data: Path) -> None:
    directory = _need(shared_data, "azure-v1-vms")
    trace = open_trace(directory)
    assert trace.describe()["split"] == "dev"
    items = list(trace.events())
    raw = raw_azure(directory / "v1.dev.txt", directory / "v1.dev.c2100000.txt")
    assert len(raw) == 259_159  # the README's count
    assert sum(v.duration.startswith("C") for v in raw) == (
        _count_censored(directory / "v1.dev.c2100000.txt")
    )
    check_azure(items, directory, raw)
    # The slice is the first 200 lines: the same VMs get the very same events.
    sliced = list(open_trace(AZURE_SLICE).events())
    ids = {e.vm_id for e in sliced if isinstance(e, VmRequest)}
    assert [e for e in items if getattr(e, "vm_id", None) in ids] == sliced


@pytest.mark.shared_data
def test_openb_full_pod_lists(shared_data: Path) -> None:
    directory = _need(shared_data, "alibaba-openb")
    default = list(open_trace(directory).events())  # the directory means 'default'
    check_openb(default, directory, directory / "openb_pod_list_default.csv")
    assert sum(isinstance(e, VmRequest) for e in default) == 8152
    cpu050 = directory / "openb_pod_list_cpu050.csv"
    creation = [int(p["creation_time"]) for p in _raw_csv(cpu050)]
    assert creation != sorted(creation)  # the file is not sorted; the stream must be
    check_openb(list(open_trace(cpu050).events()), directory, cpu050)


@pytest.mark.shared_data
@pytest.mark.usefixtures("no_gc")
def test_dlrm_both_views(shared_data: Path) -> None:
    directory = _need(shared_data, "alibaba-dlrm")
    rows = _raw_csv(directory / "disaggregated_DLRM_trace.csv")
    deleted = [r for r in rows if r["deletion_time"]]
    vms = list(open_trace(directory).events())
    assert not [i for i in vms if isinstance(i, BadRecord)]
    requests = {e.vm_id: e for e in vms if isinstance(e, VmRequest)}
    exits = {e.vm_id: e for e in vms if isinstance(e, VmExit)}
    assert len(requests) == len(rows) == 23_871
    assert set(exits) == {r["instance_sn"] for r in deleted}
    assert_time_ordered(vms)
    assert_exits_follow_requests(vms)
    first = vms[0]
    assert isinstance(first, VmRequest)
    assert first.vm_id == rows[0]["instance_sn"]  # no creation time: at 0, file order
    assert first.time == 0.0
    assert first.features == {"role": rows[0]["role"], "preexisting": True}
    for row in rows:
        request = requests[row["instance_sn"]]
        assert request.time == (float(row["creation_time"]) if row["creation_time"] else 0.0)
        assert request.deployment == row["app_name"]
        assert request.cores == float(row["cpu_request"])
        assert request.memory_gib == float(row["memory_request"])
        assert request.disk_gib == float(row["disk_request"])
        assert request.gpus == float(row["gpu_request"])
        limit = int(row["max_instance_per_node"])
        assert request.max_per_host == (None if limit == -1 else limit)

    deployments = list(open_trace(directory, view="deployments").events())
    assert_time_ordered(deployments)
    kinds = Counter(type(e).__name__ for e in deployments)
    apps = {r["app_name"] for r in rows}
    assert kinds == {
        "DeploymentArrival": len(apps),
        "DeploymentScaleOut": len(rows) - len(apps),
        "DeploymentScaleIn": len(deleted),
    }
    arrivals = [e for e in deployments if isinstance(e, DeploymentArrival)]
    assert {a.deployment_id for a in arrivals} == apps
    seen: set[str] = set()
    for event in deployments:  # every app arrives before it scales
        if isinstance(event, DeploymentArrival):
            seen.add(event.deployment_id)
        elif isinstance(event, DeploymentScaleOut | DeploymentScaleIn):
            assert event.deployment_id in seen
    with pytest.raises(TraceOptionError, match="view"):
        open_trace(directory, view="pods")


def _copy_files(files: list[Path], target: Path) -> Path:
    target.mkdir(parents=True)
    for file in files:
        shutil.copy(file, target / file.name)
    return target


def _first_samples(path: Path) -> list[TraceItem]:
    items = []
    for item in open_trace(path).events():
        items.append(item)
        if len(items) == 400:
            break
    return items


@pytest.mark.shared_data
def test_bitbrains_first_rows(shared_data: Path, tmp_path: Path) -> None:
    folder = _need(shared_data, "bitbrains-rnd") / "2013-7"
    assert detect_format(folder.parent) == "bitbrains-rnd"
    # Real files, fewer of them (speed): 1.csv and 14.csv, which starts late
    # and has rows with 0 provisioned capacity.
    copy = _copy_files([folder / "1.csv", folder / "14.csv"], tmp_path / "bb")
    items = list(open_trace(copy).events())
    assert_time_ordered(items)
    rows = {}
    for name in ("1", "14"):
        text = (folder / f"{name}.csv").read_text().splitlines()
        rows[name] = [[c.strip() for c in line.split(";")] for line in text[1:]]
    epoch = min(int(r[0][0]) for r in rows.values())
    for name, data in rows.items():
        first_row = next(r for r in data if float(r[2]) > 0 and float(r[5]) > 0)
        sample = next(e for e in items if isinstance(e, UsageSample) and e.vm_id == name)
        assert sample.time == int(first_row[0]) - epoch + 300
        assert sample.interval_s == 300
        assert sample.cpu.mean == sample.cpu.peak == float(first_row[3]) / float(first_row[2])
        assert sample.memory is not None
        assert sample.memory.mean == float(first_row[6]) / float(first_row[5])
        assert sample.cpu.samples == ()
    zero = sum(float(r[2]) == 0 or float(r[5]) == 0 for r in rows["14"])
    bad = [i for i in items if isinstance(i, BadRecord)]
    assert len(bad) == zero > 0
    assert all("provisioned" in b.reason for b in bad)
    good = sum(len(d) for d in rows.values()) - zero
    assert sum(isinstance(i, UsageSample) for i in items) == good


@pytest.mark.shared_data
def test_azure_cpu_first_row(shared_data: Path, tmp_path: Path) -> None:
    folder = _need(shared_data, "azure-v1-cpu")
    assert detect_format(folder) == "azure-v1-cpu"
    copy = tmp_path / "cpu"
    copy.mkdir()
    for name in ("microsoft_avg_100.csv", "microsoft_max_100.csv"):
        head = (folder / name).read_text().splitlines()[:30]
        (copy / name).write_text("\n".join(head) + "\n")
    avg = (folder / "microsoft_avg_100.csv").read_text().splitlines()[:2]
    peak = (folder / "microsoft_max_100.csv").read_text().splitlines()[:2]
    names, first_avg, first_max = avg[0].split(","), avg[1].split(","), peak[1].split(",")
    items = list(open_trace(copy / "microsoft_max_100.csv").events())
    assert len(items) == 29 * (len(names) - 1)
    assert_time_ordered(items)
    for column, sample in enumerate(items[: len(names) - 1], start=1):
        assert isinstance(sample, UsageSample)
        assert sample.vm_id == names[column]
        assert sample.time == float(first_avg[0]) + 300
        assert sample.cpu.mean == float(first_avg[column]) / 100
        assert sample.cpu.peak == float(first_max[column]) / 100
        assert sample.memory is None


@pytest.mark.shared_data
def test_google_gcd_first_rows(shared_data: Path, tmp_path: Path) -> None:
    folder = _need(shared_data, "google-2011-gcd")
    assert detect_format(folder) == "google-2011-gcd"
    files = sorted(folder.glob("vm_*"))[:3]
    copy = _copy_files(files, tmp_path / "gcd")
    items = list(open_trace(copy).events())
    assert_time_ordered(items)
    assert len(items) == sum(len(f.read_text().splitlines()) for f in files)
    earliest: dict[str, tuple[int, Path]] = {}
    for file in files:
        _, job, day = file.name.split("_")
        earliest[job] = min(earliest.get(job, (int(day), file)), (int(day), file))
    for job, (day, file) in earliest.items():
        cpu, mem = file.read_text().split("\n")[0].split()
        sample = next(e for e in items if isinstance(e, UsageSample) and e.vm_id == job)
        assert sample.time == (day - 1) * 86400 + 300
        assert sample.cpu.mean == sample.cpu.peak == float(cpu) / 100
        assert sample.memory is not None
        assert sample.memory.mean == float(mem) / 100


def test_a_usage_reading_past_the_schemas_bound_is_a_bad_record(tmp_path: Path) -> None:
    # The bundled PlanetLab slice: one VM's readings, the third made absurd.
    source = sorted((ROOT / "data" / "planetlab-slices-slice" / "20110303").iterdir())[0]
    lines = source.read_bytes().splitlines()
    lines[2] = b"1e300"  # percent of the request: 1e298 times it
    day = tmp_path / "pl" / "20110303"
    day.mkdir(parents=True)
    (day / source.name).write_bytes(b"\n".join(lines) + b"\n")
    items = list(open_trace(tmp_path / "pl").events())
    (bad,) = [i for i in items if isinstance(i, BadRecord)]
    assert (bad.position, bad.raw.strip()) == ("line 3", b"1e300")
    assert "cpu%: must be <= 1e+08" in bad.reason
    samples = [i for i in items if isinstance(i, UsageSample)]
    assert len(samples) == len(lines) - 1
    assert max(s.cpu.peak for s in samples) <= MAX_USAGE


@pytest.mark.shared_data
def test_planetlab_first_rows(shared_data: Path, tmp_path: Path) -> None:
    folder = _need(shared_data, "planetlab")
    assert detect_format(folder) == "planetlab"
    days = sorted(p for p in folder.iterdir() if p.is_dir())
    picked = {day.name: sorted(day.iterdir())[:2] for day in days}
    for day, files in picked.items():
        _copy_files(files, tmp_path / "pl" / day)
    items = list(open_trace(tmp_path / "pl").events())
    assert_time_ordered(items)
    first_day = days[0].name
    for file in picked[first_day]:
        sample = next(e for e in items if isinstance(e, UsageSample) and e.vm_id == file.name)
        assert sample.time == 300
        assert sample.cpu.mean == sample.cpu.peak == int(file.read_text().split()[0]) / 100
    offsets = {e.time for e in items if isinstance(e, UsageSample)}
    assert len(offsets) == 2 * 288  # two days, 288 five-minute readings each
    later = _first_samples(tmp_path / "pl" / days[1].name)  # a day folder alone
    assert isinstance(later[0], UsageSample)
    assert later[0].time == 300


def test_file_names_and_map_lines_of_digits_int_refuses_are_not_numbers(tmp_path: Path) -> None:
    # isdigit takes "\u00b2" and 5,000 digits; int() refuses both (ValueError).
    assert _natural(tmp_path / "\u00b2.csv") == (str(tmp_path), -1, "\u00b2")
    assert _natural(tmp_path / "10.csv") == (str(tmp_path), 10, "10")
    path = tmp_path / "batch_size_map.txt"
    path.write_text("9" * 5_000 + " 4\n2 1\n")
    assert read_batch_buckets(path) == {2: "1"}
