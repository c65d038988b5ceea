"""Azure Public Dataset V1 VM trace (Resource Central, SOSP'17), Bergsma et al. encoding.

The encoding (see ``INPUT.md`` next to the trace) keeps, per 300 s arrival
bin, the flavor of every VM that arrived and, in a partner file, the bin of its
lifetime: ``U<bin>`` (it exited before the censoring time T of the file name
``v1.<split>.c<T>.txt``) or ``C<bin>`` (still running at T). ``|`` closes a
batch of VMs one tenant started in that bin. Exact times were lost in the
encoding, so this adapter restores them by two documented, deterministic rules:

Arrival times
    A line stamped ``t`` holds the arrivals of ``(p, t]`` where ``p`` is the
    previous line's stamp (``t - 300`` for the first line, not below 0). Its
    ``n`` VMs are spread evenly in token order: the k-th (0-based) arrives at
    ``p + (t - p) * (k + 1) / n``, so the last one arrives at ``t`` exactly and
    no two lines interleave.

Lifetimes
    ``v1.interval_map.txt`` maps durations (seconds, in the source's 300 s
    steps) to bins. Bin ``b`` covers ``[lo_b, lo_{b+1})`` with ``lo_b`` the
    smallest duration mapped to it; the last bin is open, ``[lo_last, inf)``
    (the map stops listing at 20 days but longer VMs land there too). An
    uncensored VM's lifetime is drawn uniformly from its bin *intersected with*
    ``[0, T - arrival]``: it is known to have exited by T, so for the open bin
    (and any bin reaching past T) the upper bound is T - arrival. If the data
    put a bin entirely past T the cap wins and the VM exits at T. A ``C`` VM
    gets a request and no exit (right-censored at T = ``end_time``).

Randomness comes from ``numpy.random.default_rng((seed, line_number))``: one
generator per line, so the same seed gives the same events, a slice of the
first lines of a split gives exactly the events of those lines in the full
split, and a corrupted line does not shift the draws of the others.

Tenant batches become deployments: id ``"<t>-<batch index in line>"``, used as
tenant id as well (the encoding keeps nothing else of the tenant). VM ids are
``"az-<line>-<position among the line's VMs>"``. Features hold only what is
known when the VM arrives: ``batch_size`` (VMs in its batch) and
``hour_of_day`` of the arrival, counted from the trace epoch (the encoding does
not keep the wall-clock start).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from itertools import repeat, zip_longest
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from lavad.streams.adapters.base import (
    Trace,
    TraceFormatError,
    TraceItem,
    TraceOptionError,
    bad_record,
    pick_listed,
)
from lavad.streams.codec import BadRecord
from lavad.streams.fastbuild import fast_constructor
from lavad.streams.schema import Features, VmExit, VmRequest

BIN_S: Final = 300.0
FLAVOR_MAP: Final = "flav_map.txt"
INTERVAL_MAP: Final = "v1.interval_map.txt"
BATCH_SIZE_MAP: Final = "batch_size_map.txt"

IntArray = NDArray[np.int64]
# (time, seq, kind, payload): a request (kind 0, payload the event) or an exit
# (kind 1, payload the VM id: the VmExit is built when it is due, so the
# calendar holds only plain tuples, which the garbage collector stops tracking).
_ExitEntry = tuple[float, int, int, str]
_Entry = tuple[float, int, int, VmRequest] | _ExitEntry

_VM_TOKEN = re.compile(r"[^,|]+")
_SHAPE = re.compile(r"[x|](?:,[x|])*")
_ARRIVALS = re.compile(r"v1\.(?P<split>.+)\.txt")
_DURATIONS = re.compile(r"v1\.(?P<split>.+)\.c(?P<censor>\d+)\.txt")
# v1.<name>.txt files that are maps, not splits.
_NOT_SPLITS: Final = frozenset({"interval_map"})


def _parse_name(name: str) -> tuple[str, int | None] | None:
    """``(split, censor_time)`` for an arrival (censor None) or duration file name."""
    match = _DURATIONS.fullmatch(name)
    if match:
        return match["split"], int(match["censor"])
    match = _ARRIVALS.fullmatch(name)
    if match and match["split"] not in _NOT_SPLITS:
        return match["split"], None
    return None


def find_splits(directory: Path) -> dict[str, Path]:
    """Arrival files ``v1.<split>.txt`` in ``directory``, by split name."""
    splits: dict[str, Path] = {}
    for entry in directory.iterdir():
        parsed = _parse_name(entry.name)
        if parsed is not None and parsed[1] is None and entry.is_file():
            splits[parsed[0]] = entry
    return splits


def sniff(path: Path) -> bool:
    """A ``v1.<split>[.c<T>].txt`` file, or a directory holding the maps or a split."""
    if path.is_dir():
        return (path / INTERVAL_MAP).is_file() or bool(find_splits(path))
    return _parse_name(path.name) is not None


def read_flavors(path: Path) -> dict[str, tuple[float, float]]:
    """``flav_map.txt``: ``<vCPU>,<memory GB> <letter>`` -> {letter: (cores, GiB)}.

    The source's "GB" are the provider's nominal sizes (e.g. 0.75, 1.75, 3.5),
    which Azure defines in GiB, so they are taken as GiB unchanged.
    """
    flavors: dict[str, tuple[float, float]] = {}
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, f"cannot read the flavor map: {exc}") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            shape, letter = line.split()
            cores_s, memory_s = shape.split(",")
            cores, memory = float(cores_s), float(memory_s)
        except ValueError:
            raise TraceFormatError(
                path, f"line {lineno}: expected '<vCPU>,<memory GB> <letter>', got {line!r}"
            ) from None
        if not (math.isfinite(cores) and cores > 0 and math.isfinite(memory) and memory >= 0):
            raise TraceFormatError(path, f"line {lineno}: impossible shape {line!r}")
        flavors[letter] = (cores, memory)
    if not flavors:
        raise TraceFormatError(path, "the flavor map is empty")
    return flavors


def read_bins(path: Path) -> list[float]:
    """``v1.interval_map.txt`` (``<seconds> <bin>``) -> each bin's lower bound ``lo_b``.

    Bin b covers ``[lo_b, lo_{b+1})``; the last bin is open-ended.
    """
    lows: dict[int, float] = {}
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, f"cannot read the interval map: {exc}") from None
    last_bin = -1
    last_seconds = -math.inf
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            seconds_s, bin_s = line.split()
            seconds, index = float(seconds_s), int(bin_s)
        except ValueError:
            raise TraceFormatError(
                path, f"line {lineno}: expected '<seconds> <bin>', got {line!r}"
            ) from None
        if index < last_bin or index > last_bin + 1:
            raise TraceFormatError(path, f"line {lineno}: bins must rise by 0 or 1, got {line!r}")
        if not seconds > last_seconds:
            raise TraceFormatError(path, f"line {lineno}: durations must increase, got {line!r}")
        last_bin, last_seconds = index, seconds
        lows.setdefault(index, seconds)
    if not lows:
        raise TraceFormatError(path, "the interval map is empty")
    if 0 not in lows:
        raise TraceFormatError(path, "bins must start at 0")
    return [lows[b] for b in range(len(lows))]


def read_batch_buckets(path: Path) -> dict[int, str]:
    """``batch_size_map.txt`` (``<size> <bucket>``), when present: sizes -> bucket labels."""
    buckets: dict[int, str] = {}
    if not path.is_file():
        return buckets
    for line in path.read_text(encoding="ascii", errors="replace").splitlines():
        parts = line.split()
        # (int() refuses more than 4,300 digits.)
        if len(parts) == 2 and parts[0].isdigit() and len(parts[0]) <= 18:
            buckets[int(parts[0])] = parts[1]
    return buckets


class AzureV1Vms(Trace):
    """Azure V1 VM arrivals and lifetimes, one split (any name) of the Bergsma encoding."""

    name = "azure-v1-vms"
    options = frozenset({"split"})
    vm_features = ("batch_size", "hour_of_day")

    def __init__(self, path: Path, *, seed: int, pool: str, split: str | None = None) -> None:
        super().__init__(path, seed=seed, pool=pool)
        self.split, self.arrivals = self._resolve(path, split)
        directory = self.arrivals.parent
        self.durations, censor = self._partner(directory, self.split)
        self.censor_time = float(censor)
        self.end_time = self.censor_time
        self.flavors = read_flavors(self._required(directory, FLAVOR_MAP))
        self._flavor_index = {letter: i for i, letter in enumerate(self.flavors)}
        self._cores = np.array([cores for cores, _ in self.flavors.values()])
        self._memory = np.array([memory for _, memory in self.flavors.values()])
        lows = read_bins(self._required(directory, INTERVAL_MAP))
        self.bin_bounds: list[tuple[float, float]] = [
            (lo, lows[b + 1] if b + 1 < len(lows) else math.inf) for b, lo in enumerate(lows)
        ]
        self.batch_buckets = read_batch_buckets(directory / BATCH_SIZE_MAP)
        # Token -> bin index; every C<b> maps to one extra index whose bounds
        # are NaN, so censored VMs come out of the vector maths with no exit.
        censored = len(lows)
        self._bin_of_token: dict[str, int] = {}
        for b in range(len(lows)):
            self._bin_of_token[f"U{b}"] = b
            self._bin_of_token[f"C{b}"] = censored
        self._lows = np.array([*lows, math.nan])
        self._highs = np.array([hi for _, hi in self.bin_bounds] + [math.nan])

    # ----------------------------------------------------------- resolution

    @staticmethod
    def _resolve(path: Path, split: str | None) -> tuple[str, Path]:
        """The split and its arrival file, from a directory or one of the split's files."""
        if path.is_dir():
            splits = find_splits(path)
            picked = pick_listed(path, splits, split, what="split")
            if picked is not None:
                return picked
            if not splits:
                raise TraceFormatError(path, "no arrival file v1.<split>.txt in this directory")
            example = path / f"v1.{sorted(splits)[0]}.txt"
            raise TraceFormatError(
                path,
                f"holds {len(splits)} splits {sorted(splits)}; pass one split's file "
                f"(e.g. {example}) or split=<name>",
            )
        parsed = _parse_name(path.name)
        if parsed is None:
            raise TraceFormatError(path, "not a v1.<split>.txt or v1.<split>.c<T>.txt file")
        name = parsed[0]
        if split is not None and split != name:
            raise TraceOptionError(path, f"split={split!r} contradicts the file's split {name!r}")
        arrivals = path.with_name(f"v1.{name}.txt")
        if not arrivals.is_file():
            raise TraceFormatError(path, f"the arrival file {arrivals.name} is missing")
        return name, arrivals

    @staticmethod
    def _partner(directory: Path, split: str) -> tuple[Path, int]:
        """The duration file ``v1.<split>.c<T>.txt`` and its censoring time T."""
        found: list[tuple[Path, int]] = []
        for entry in directory.iterdir():
            match = _DURATIONS.fullmatch(entry.name)
            if match and match["split"] == split:
                found.append((entry, int(match["censor"])))
        if len(found) != 1:
            names = sorted(p.name for p, _ in found)
            raise TraceFormatError(
                directory,
                f"split {split!r} needs exactly one duration file v1.{split}.c<T>.txt, "
                f"found {names or 'none'}",
            )
        return found[0]

    @staticmethod
    def _required(directory: Path, name: str) -> Path:
        path = directory / name
        if not path.is_file():
            raise TraceFormatError(directory, f"{name} is missing (the trace needs it)")
        return path

    # --------------------------------------------------------------- facts

    def facts(self) -> dict[str, Any]:
        lo_open = self.bin_bounds[-1][0]
        return {
            "split": self.split,
            "arrival_file": str(self.arrivals),
            "duration_file": str(self.durations),
            "censor_time": self.censor_time,
            "bin_s": BIN_S,
            "flavors": {k: {"cores": c, "memory_gib": m} for k, (c, m) in self.flavors.items()},
            "lifetime_bins": [
                [lo, hi if math.isfinite(hi) else None] for lo, hi in self.bin_bounds
            ],
            "batch_size_buckets": {str(k): v for k, v in self.batch_buckets.items()},
            "arrival_rule": (
                "line t holds the arrivals of (prev, t]; the k-th (0-based) of n "
                "arrives at prev + (t - prev) * (k + 1) / n"
            ),
            "lifetime_rule": (
                "U<b>: uniform in [lo_b, min(lo_{b+1}, T - arrival)) with "
                "default_rng((seed, line)); cap at T wins; C<b>: censored, no exit"
            ),
            "open_bin": f"[{lo_open:g}, inf), bounded above by T - arrival",
            "features": list(self.vm_features),
            "source": "Azure Public Dataset V1 vmtable (Cortez et al., SOSP'17), "
            "encoded by Bergsma et al. (SOSP'21)",
            "licence": "CC-BY-4.0",
        }

    # -------------------------------------------------------------- events

    def _parse_line(
        self, lineno: int, arrival: bytes | None, duration: bytes | None, prev: float | None
    ) -> BadRecord | _Line:
        """One line pair -> its parsed VMs, or a BadRecord saying why it is malformed.

        A line is all or nothing: any bad token makes the whole line a BadRecord,
        since a damaged line may also be misaligned with its partner.
        """
        if arrival is None:
            return bad_record(
                self.durations, lineno, duration or b"", "no matching line in the arrival file"
            )
        if duration is None:
            return bad_record(
                self.arrivals, lineno, arrival, "no matching line in the duration file"
            )

        def bad(reason: str) -> BadRecord:
            return bad_record(self.arrivals, lineno, arrival, reason)

        try:
            a_text = arrival.decode("ascii")
            d_text = duration.decode("ascii")
        except UnicodeDecodeError as exc:
            return bad(f"not ASCII: {exc}")
        a_parts = a_text.split(None, 1)
        d_parts = d_text.split(None, 1)
        if not a_parts or not d_parts:
            return bad("arrival or duration line is empty")
        stamp = a_parts[0]
        if d_parts[0] != stamp:
            return bad(f"time stamp {stamp!r} != duration file's {d_parts[0]!r}")
        try:
            t = float(int(stamp))
        except ValueError:
            return bad(f"time stamp {stamp!r} is not an integer")
        if t < 0 or (prev is not None and t <= prev):
            return bad(f"time stamp {stamp} does not follow the previous line's {prev}")
        if t > self.censor_time:
            return bad(f"time stamp {stamp} is after the censoring time {self.censor_time:g}")
        a_rest = a_parts[1].strip() if len(a_parts) > 1 else ""
        d_rest = d_parts[1].strip() if len(d_parts) > 1 else ""
        # Parsed with C-speed regex passes, not a Python loop per token: the
        # "shape" of a line is its token list with every VM token replaced by
        # "x", so "g,g,|,b,|" -> "x,x,|,x,|"; both files must have the same
        # shape, and a shape must be single-character tokens between commas.
        shape = _VM_TOKEN.sub("x", a_rest)
        d_shape = _VM_TOKEN.sub("x", d_rest)
        if shape != d_shape:
            a_count = shape.count(",") + 1 if shape else 0
            d_count = d_shape.count(",") + 1 if d_shape else 0
            if a_count != d_count:
                return bad(f"{a_count} arrival tokens but {d_count} duration tokens")
            pairs = zip(shape.split(","), d_shape.split(","), strict=True)
            first = next((i for i, (x, y) in enumerate(pairs) if x != y), 0)
            return bad(f"token {first}: batch ends differ between the files")
        if shape and not _SHAPE.fullmatch(shape):
            return bad("malformed token list (empty token or stray '|')")
        flavors = _VM_TOKEN.findall(a_rest)
        shape_of = self._flavor_index
        shapes = [shape_of.get(token) for token in flavors]
        if None in shapes:
            return bad(f"unknown flavor {flavors[shapes.index(None)]!r}")
        bin_of = self._bin_of_token
        durations = _VM_TOKEN.findall(d_rest)
        bins = [bin_of.get(token) for token in durations]
        if None in bins:
            return bad(f"bad duration {durations[bins.index(None)]!r} (want U<bin> or C<bin>)")
        # Batch index of a VM = number of '|' before it in the line.
        bars = np.frombuffer(shape.encode("ascii"), dtype=np.uint8)[::2] == ord("|")
        batches = (np.cumsum(bars) - bars)[~bars].astype(np.int64)
        return _Line(
            t,
            stamp,
            flavors,
            np.asarray(shapes, dtype=np.int64),
            np.asarray(bins, dtype=np.int64),
            batches,
        )

    def _sound_stamp(
        self, arrival: bytes | None, duration: bytes | None, prev: float | None
    ) -> float | None:
        """The time stamp of a line pair, if both agree and it follows ``prev``."""
        if arrival is None or duration is None:
            return None
        a_parts = arrival.split(None, 1)
        d_parts = duration.split(None, 1)
        if not a_parts or not d_parts or a_parts[0] != d_parts[0] or not a_parts[0].isdigit():
            return None
        t = float(a_parts[0])
        if (prev is not None and t <= prev) or t > self.censor_time:
            return None
        return t

    def events(self) -> Iterator[TraceItem]:
        # Per line, numpy computes arrival and exit times and C-level map()
        # builds the events; Python only sorts and yields. Pending exits wait
        # in a calendar of 300 s buckets keyed by ceil(exit / 300): a line's
        # window (start, t] takes its due buckets, adds its own requests and
        # the exits that fall inside it, and sorts them once. No heap of every
        # live VM (~10^5 here), whose pops would dominate the cost.
        # Order within a window: (time, seq, kind) where seq numbers requests
        # in trace order and an exit carries its request's seq with kind 1, so
        # equal times keep request order and a VM's exit follows its request.
        pool = self.pool
        calendar: dict[int, list[_ExitEntry]] = {}
        next_key = 0
        seq = 0
        prev: float | None = None
        with self.arrivals.open("rb") as fa, self.durations.open("rb") as fd:
            for lineno, (arrival, duration) in enumerate(zip_longest(fa, fd), start=1):
                if (arrival is None or not arrival.strip()) and (
                    duration is None or not duration.strip()
                ):
                    continue  # blank lines (e.g. at the end of a file) hold no record
                line = self._parse_line(lineno, arrival, duration, prev)
                if isinstance(line, BadRecord):
                    yield line
                    # A bad line with a sound time stamp still ends its bin:
                    # the next line's arrivals start there, as they would have.
                    stamp = self._sound_stamp(arrival, duration, prev)
                    if stamp is not None:
                        prev = stamp
                    continue
                t = line.t
                start = max(0.0, t - BIN_S) if prev is None else prev
                prev = t
                # The exits due in this line's window (start, t].
                window: list[_Entry] = []
                last_key = math.ceil(t / BIN_S)
                if next_key < last_key:
                    for key in range(next_key, last_key):
                        bucket = calendar.pop(key, None)
                        if bucket:
                            window += bucket
                    next_key = last_key
                bucket = calendar.get(last_key)
                if bucket:
                    if t >= last_key * BIN_S:
                        window += bucket
                        del calendar[last_key]
                    else:
                        window += [x for x in bucket if x[0] <= t]
                        calendar[last_key] = [x for x in bucket if x[0] > t]
                n = len(line.flavors)
                if n:
                    window += self._line_events(line, lineno, start, seq, calendar)
                    seq += n
                window.sort()
                for entry in window:
                    payload = entry[3]
                    if isinstance(payload, str):
                        yield _exit(entry[0], pool, payload)
                    else:
                        yield payload
        for key in sorted(calendar):
            for when, _, _, vm_id in sorted(calendar[key]):
                yield _exit(when, pool, vm_id)

    def _line_events(
        self,
        line: _Line,
        lineno: int,
        start: float,
        seq: int,
        calendar: dict[int, list[_ExitEntry]],
    ) -> list[_Entry]:
        """The line's requests and in-window exits as entries; later exits go to the calendar."""
        pool = self.pool
        censor = self.censor_time
        t = line.t
        n = len(line.flavors)
        # Arrivals spread evenly over (start, t]; the last one at t.
        arrive = start + (t - start) * np.arange(1, n + 1) / n
        # Uncensored lifetimes: uniform in [lo, min(hi, T - now)), the cap T
        # winning; censored VMs have NaN bounds, so NaN ends: no exit.
        index = line.bins
        lo = self._lows[index]
        room = censor - arrive
        top = np.minimum(self._highs[index], room)
        draws = np.random.default_rng((self.seed, lineno)).random(n)
        life = np.where(top > lo, lo + draws * (top - lo), np.minimum(room, lo))
        ends = np.minimum(arrive + life, censor)

        nows: list[float] = arrive.tolist()
        hours: list[int] = ((arrive // 3600.0) % 24).astype(np.int64).tolist()
        ids = list(map(f"az-{lineno}-".__add__, _numbers(n)))
        batches = line.batches
        names = list(map(f"{line.stamp}-".__add__, _numbers(int(batches[-1]) + 1)))
        tenants = list(map(names.__getitem__, batches.tolist()))
        sizes: list[int] = np.bincount(batches)[batches].tolist()
        features = [{"batch_size": s, "hour_of_day": h} for s, h in zip(sizes, hours, strict=True)]
        requests = map(
            _request,
            nows,
            repeat(pool),
            ids,
            self._cores[line.shapes].tolist(),
            self._memory[line.shapes].tolist(),
            tenants,
            tenants,
            line.flavors,
            features,
        )
        entries: list[_Entry] = list(zip(nows, range(seq, seq + n), repeat(0), requests))

        live = np.flatnonzero(~np.isnan(ends))
        if len(live):
            live_ends: list[float] = ends[live].tolist()
            live_k: list[int] = live.tolist()
            keys: list[int] = np.ceil(ends[live] / BIN_S).astype(np.int64).tolist()
            for end, k, key in zip(live_ends, live_k, keys, strict=True):
                entry: _ExitEntry = (end, seq + k, 1, ids[k])
                if end <= t:
                    entries.append(entry)
                else:
                    pending = calendar.get(key)
                    if pending is None:
                        calendar[key] = [entry]
                    else:
                        pending.append(entry)
        return entries


_NUMBERS: list[str] = []


def _numbers(n: int) -> list[str]:
    """``["0", "1", ..., str(n - 1)]``, from a cache grown on demand (ids are built per line)."""
    if len(_NUMBERS) < n:
        _NUMBERS.extend(str(k) for k in range(len(_NUMBERS), n))
    return _NUMBERS[:n]


class _Line:
    """One parsed arrival/duration line pair, as numpy arrays over its VMs."""

    __slots__ = ("batches", "bins", "flavors", "shapes", "stamp", "t")

    def __init__(
        self,
        t: float,
        stamp: str,
        flavors: list[str],
        shapes: IntArray,
        bins: IntArray,
        batches: IntArray,
    ) -> None:
        self.t = t
        self.stamp = stamp
        self.flavors = flavors  # flavor letter per VM
        self.shapes = shapes  # index into the flavor table per VM
        self.bins = bins  # lifetime bin per VM; the extra last index means censored
        self.batches = batches  # batch index in the line per VM


_request: Callable[[float, str, str, float, float, str, str, str, Features], VmRequest] = (
    fast_constructor(
        VmRequest,
        "time",
        "pool",
        "vm_id",
        "cores",
        "memory_gib",
        "tenant",
        "deployment",
        "flavor",
        "features",
    )
)
_exit: Callable[[float, str, str], VmExit] = fast_constructor(VmExit, "time", "pool", "vm_id")
