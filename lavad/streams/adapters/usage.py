"""Resource-usage traces -> ``UsageSample`` events, merged across VMs in time order.

Four real sources, one rule set:

- Usage is a fraction of what the VM was given (percent / 100, or used /
  provisioned); ``mean`` and ``peak`` are the same single reading unless the
  source gives both (Azure V1 CPU: average and maximum files). No source here
  keeps raw per-interval samples, so ``samples`` is empty.
- ``time`` is the *end* of the reading's 300 s interval, and each trace's
  first interval starts at 0: the first samples are at t = 300. (The schema
  defines a sample as covering ``[time - interval_s, time)``; starting at 300
  keeps every interval at or after the trace epoch.)
- Samples are emitted by (time, file order, line); a malformed row becomes a
  ``BadRecord`` emitted right after the previous good row of its file.

Each file is small, so it is read whole into numpy and closed before the next
one (the PlanetLab set alone has ~2,000 files).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Iterator
from itertools import zip_longest
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from lavad.streams.adapters.base import (
    RowError,
    Trace,
    TraceFormatError,
    TraceItem,
    bad_record,
    number,
    sniff_header,
)
from lavad.streams.codec import BadRecord
from lavad.streams.fastbuild import fast_constructor
from lavad.streams.schema import MAX_USAGE, UsageSample, UsageStats

INTERVAL_S: Final = 300.0
DAY_S: Final = 86_400.0

FloatArray = NDArray[np.float64]

_sample: Callable[[float, str, str, float, UsageStats, UsageStats | None], UsageSample] = (
    fast_constructor(UsageSample, "time", "pool", "vm_id", "interval_s", "cpu", "memory")
)
_stats: Callable[[float, float], UsageStats] = fast_constructor(UsageStats, "mean", "peak")
# Readings in percent of the request, bounded as the schema bounds usage (the
# models' arithmetic stays finite).
_MAX_PERCENT = 100.0 * MAX_USAGE


def _usage(value: float, column: str) -> float:
    """A reading as a multiple of the request, within the schema's bound."""
    if value > MAX_USAGE:
        raise RowError(f"{column}: {value:g} times the request, more than {MAX_USAGE:g}")
    return value


class _Series:
    """One file's readings: relative interval starts and usage fractions, plus bad rows."""

    def __init__(self, vm_id: str) -> None:
        self.vm_id = vm_id
        self.start: list[float] = []  # interval start, seconds (before any offset)
        self.line: list[int] = []
        self.cpu_mean: list[float] = []
        self.cpu_peak: list[float] = []
        self.mem: list[float] = []  # empty when the source has no memory
        # (interval start of the previous good row, line, record)
        self.bad: list[tuple[float, int, BadRecord]] = []

    def add(self, start: float, lineno: int, cpu_mean: float, cpu_peak: float) -> None:
        self.start.append(start)
        self.line.append(lineno)
        self.cpu_mean.append(cpu_mean)
        self.cpu_peak.append(cpu_peak)

    def add_bad(self, record: BadRecord, lineno: int) -> None:
        previous = self.start[-1] if self.start else -math.inf
        self.bad.append((previous, lineno, record))


def _emit(series: list[_Series], pool: str, offset: float = 0.0) -> Iterator[TraceItem]:
    """All readings of all series in (time, series, line) order, bad rows in place.

    ``time = start - offset + 300``: ``offset`` makes the earliest interval
    start 0 where the source's clock has another epoch.
    """
    times: list[FloatArray] = []
    owner: list[NDArray[np.int64]] = []
    lines: list[NDArray[np.int64]] = []
    kinds: list[NDArray[np.int64]] = []  # 0: sample row i, 1: bad record i
    index: list[NDArray[np.int64]] = []
    for s, one in enumerate(series):
        if one.start:
            times.append(np.asarray(one.start, dtype=np.float64))
            owner.append(np.full(len(one.start), s, dtype=np.int64))
            lines.append(np.asarray(one.line, dtype=np.int64))
            kinds.append(np.zeros(len(one.start), dtype=np.int64))
            index.append(np.arange(len(one.start), dtype=np.int64))
        if one.bad:
            times.append(np.asarray([b[0] for b in one.bad], dtype=np.float64))
            owner.append(np.full(len(one.bad), s, dtype=np.int64))
            lines.append(np.asarray([b[1] for b in one.bad], dtype=np.int64))
            kinds.append(np.ones(len(one.bad), dtype=np.int64))
            index.append(np.arange(len(one.bad), dtype=np.int64))
    if not times:
        return
    t_all = np.concatenate(times)
    o_all = np.concatenate(owner)
    order = np.lexsort((np.concatenate(lines), o_all, t_all))
    t_list: list[float] = (t_all[order] - offset + INTERVAL_S).tolist()
    o_list: list[int] = o_all[order].tolist()
    k_list: list[int] = np.concatenate(kinds)[order].tolist()
    i_list: list[int] = np.concatenate(index)[order].tolist()
    for t, s, kind, i in zip(t_list, o_list, k_list, i_list, strict=True):
        one = series[s]
        if kind:
            yield one.bad[i][2]
            continue
        memory = _stats(one.mem[i], one.mem[i]) if one.mem else None
        yield _sample(
            t, pool, one.vm_id, INTERVAL_S, _stats(one.cpu_mean[i], one.cpu_peak[i]), memory
        )


def _read_readings(
    path: Path, one: _Series, base: float, parse: Callable[[bytes], tuple[float, float | None]]
) -> None:
    """A file of one reading a line into ``one``: line i (0-based) covers
    ``[base + i * 300, ... + 300)``; ``parse`` gives its CPU and memory (None
    where the source has none), or raises ``RowError``."""
    with path.open("rb") as handle:
        for i, raw in enumerate(handle):
            lineno = i + 1
            try:
                cpu, mem = parse(raw)
            except (RowError, UnicodeDecodeError) as exc:
                one.add_bad(bad_record(path, lineno, raw, str(exc)), lineno)
                continue
            one.add(base + i * INTERVAL_S, lineno, cpu, cpu)
            if mem is not None:
                one.mem.append(mem)


# ------------------------------------------------------------------ bitbrains

BITBRAINS_HEADER: Final = "Timestamp [ms];"
_BB_TIME = "Timestamp [ms]"
_BB_CPU_CAP = "CPU capacity provisioned [MHZ]"
_BB_CPU_USE = "CPU usage [MHZ]"
_BB_MEM_CAP = "Memory capacity provisioned [KB]"
_BB_MEM_USE = "Memory usage [KB]"


def _bitbrains_files(path: Path) -> list[Path]:
    """Bitbrains CSVs: the file itself, or those in the directory and its subdirectories."""
    if path.is_file():
        return [path] if sniff_header(path, BITBRAINS_HEADER) else []
    found = [p for p in path.glob("*.csv") if p.is_file()]
    for sub in sorted(p for p in path.iterdir() if p.is_dir()):
        found.extend(p for p in sub.glob("*.csv") if p.is_file())
    found = [p for p in found if sniff_header(p, BITBRAINS_HEADER)]
    return sorted(found, key=_natural)


def _natural(path: Path) -> tuple[str, int, str]:
    """Sort key: directory, then numeric file stems in number order (2.csv before 10.csv)."""
    stem = path.stem
    # isdecimal, not isdigit: int() refuses digits such as "²" that isdigit takes.
    return (str(path.parent), int(stem) if stem.isdecimal() else -1, stem)


def _bitbrains_columns(path: Path) -> dict[str, int]:
    """Column index by header name; a header without the needed columns is a format error."""
    with path.open("rb") as handle:
        first = handle.readline().decode("utf-8-sig", "replace")
    col = {name.strip(): i for i, name in enumerate(first.split(";"))}
    needed = (_BB_TIME, _BB_CPU_CAP, _BB_CPU_USE, _BB_MEM_CAP, _BB_MEM_USE)
    missing = [name for name in needed if name not in col]
    if missing:
        raise TraceFormatError(path, f"header lacks {missing}")
    return col


def sniff_bitbrains(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".csv" and sniff_header(path, BITBRAINS_HEADER)
    first = next(iter(sorted(path.glob("*.csv"))), None)
    if first is None:
        subs = sorted(p for p in path.iterdir() if p.is_dir())
        first = next((c for s in subs for c in sorted(s.glob("*.csv"))), None)
    return first is not None and sniff_header(first, BITBRAINS_HEADER)


class Bitbrains(Trace):
    """Bitbrains GWA-T-12 Rnd: CPU and memory used against provisioned, per VM file.

    The ``Timestamp [ms]`` column holds Unix *seconds* (1372629804 is
    2013-06-30, and rows are 300 apart), despite its header: it is read as
    seconds and made relative to the earliest timestamp across all files.
    The VM id is the file name without ``.csv``. A row with 0 provisioned CPU
    or memory (the VM was off or unmeasured: thousands of rows of VMs 20 and 38) has
    no defined fraction and becomes a BadRecord.
    """

    name = "bitbrains-rnd"

    def __init__(self, path: Path, *, seed: int, pool: str) -> None:
        super().__init__(path, seed=seed, pool=pool)
        self.files = _bitbrains_files(path)
        if not self.files:
            raise TraceFormatError(path, "no Bitbrains CSV files (header 'Timestamp [ms];')")
        for file in self.files:  # at open, so the stream itself never raises
            _bitbrains_columns(file)

    def facts(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "time": "timestamp (Unix seconds despite '[ms]') - earliest + 300",
            "cpu": "CPU usage MHz / CPU capacity provisioned MHz",
            "memory": "memory usage KB / memory capacity provisioned KB",
            "bad_rows": "provisioned CPU or memory 0",
            "source": "Bitbrains GWA-T-12 Rnd (Shen et al., CCGrid'15)",
            "licence": "cite the source",
        }

    def _read(self, path: Path) -> _Series:
        series = _Series(path.stem)
        col = _bitbrains_columns(path)
        width = len(col)
        with path.open("rb") as handle:
            handle.readline()
            for lineno, raw in enumerate(handle, start=2):
                if not raw.strip():
                    continue
                try:
                    cells = raw.decode("ascii").split(";")
                    if len(cells) != width:
                        raise RowError(f"{len(cells)} fields, header has {width}")
                    stamp = number(cells[col[_BB_TIME]], _BB_TIME)
                    cpu_cap = number(cells[col[_BB_CPU_CAP]], _BB_CPU_CAP)
                    mem_cap = number(cells[col[_BB_MEM_CAP]], _BB_MEM_CAP)
                    if cpu_cap <= 0 or mem_cap <= 0:
                        raise RowError("provisioned CPU or memory is 0: no usage fraction")
                    used_cpu = number(cells[col[_BB_CPU_USE]], _BB_CPU_USE)
                    used_mem = number(cells[col[_BB_MEM_USE]], _BB_MEM_USE)
                    cpu = _usage(used_cpu / cpu_cap, _BB_CPU_USE)
                    mem = _usage(used_mem / mem_cap, _BB_MEM_USE)
                except (RowError, UnicodeDecodeError) as exc:
                    series.add_bad(bad_record(path, lineno, raw, str(exc)), lineno)
                    continue
                series.add(stamp, lineno, cpu, cpu)
                series.mem.append(mem)
        return series

    def events(self) -> Iterator[TraceItem]:
        series = [self._read(path) for path in self.files]
        offset = min((min(s.start) for s in series if s.start), default=0.0)
        yield from _emit(series, self.pool, offset)


# --------------------------------------------------------------- azure-v1-cpu

_AZ_AVG = re.compile(r"(?P<prefix>.*)_avg_(?P<suffix>.*)\.csv")
_AZ_MAX = re.compile(r"(?P<prefix>.*)_max_(?P<suffix>.*)\.csv")


def _azure_cpu_pair(path: Path) -> tuple[Path, Path] | None:
    """(average file, maximum file) for a directory or either file of the pair."""
    if path.is_dir():
        for avg in sorted(path.glob("*_avg_*.csv")):
            pair = _azure_cpu_pair(avg)
            if pair is not None:
                return pair
        return None
    match = _AZ_AVG.fullmatch(path.name)
    if match:
        other = path.with_name(f"{match['prefix']}_max_{match['suffix']}.csv")
        return (path, other) if other.is_file() and sniff_header(path, "t_s,") else None
    match = _AZ_MAX.fullmatch(path.name)
    if match:
        other = path.with_name(f"{match['prefix']}_avg_{match['suffix']}.csv")
        return (other, path) if other.is_file() and sniff_header(path, "t_s,") else None
    return None


def _csv_header(path: Path) -> list[str]:
    with path.open("rb") as handle:
        return handle.readline().decode("utf-8-sig", "replace").strip().split(",")


def sniff_azure_cpu(path: Path) -> bool:
    return _azure_cpu_pair(path) is not None


class AzureV1Cpu(Trace):
    """Azure V1 per-VM CPU readings (DataCenterSim CSVs): average -> mean, maximum -> peak.

    Row ``t_s`` of both files covers ``[t_s, t_s + 300)``; one sample per VM
    column (``vm0``..``vm99``, the VM id) and row, in time then column order.
    """

    name = "azure-v1-cpu"

    def __init__(self, path: Path, *, seed: int, pool: str) -> None:
        super().__init__(path, seed=seed, pool=pool)
        pair = _azure_cpu_pair(path)
        if pair is None:
            raise TraceFormatError(path, "no *_avg_*.csv / *_max_*.csv pair with a t_s column")
        self.avg_file, self.max_file = pair
        self.header = _csv_header(self.avg_file)
        if _csv_header(self.max_file) != self.header:
            raise TraceFormatError(self.max_file, "header differs from the average file's")
        if len(self.header) < 2 or self.header[0] != "t_s":
            raise TraceFormatError(self.avg_file, "want columns t_s, <vm>, <vm>, ...")

    def facts(self) -> dict[str, Any]:
        return {
            "avg_file": str(self.avg_file),
            "max_file": str(self.max_file),
            "time": "t_s + 300",
            "cpu": "mean = average % / 100, peak = maximum % / 100",
            "source": "Azure Public Dataset V1 CPU readings via R package DataCenterSim",
            "licence": "CC-BY-4.0",
        }

    def events(self) -> Iterator[TraceItem]:
        header = self.header
        with self.avg_file.open("rb") as fa, self.max_file.open("rb") as fm:
            fa.readline()
            fm.readline()
            series = [_Series(name) for name in header[1:]]
            width = len(header)
            for lineno, (avg_line, max_line) in enumerate(zip_longest(fa, fm), start=2):
                avg_raw = avg_line or b""
                max_raw = max_line or b""
                if not avg_raw.strip() and not max_raw.strip():
                    continue
                try:
                    if avg_line is None or max_line is None:
                        raise RowError("the average and maximum files differ in length")
                    avg = avg_raw.decode("ascii").split(",")
                    peak = max_raw.decode("ascii").split(",")
                    if len(avg) != width or len(peak) != width:
                        raise RowError(f"want {width} fields in both files")
                    if avg[0].strip() != peak[0].strip():
                        raise RowError(f"t_s {avg[0]!r} != maximum file's {peak[0]!r}")
                    start = number(avg[0], "t_s")
                except (RowError, UnicodeDecodeError) as exc:
                    raw = avg_raw if avg_line is not None else max_raw
                    source = self.avg_file if avg_line is not None else self.max_file
                    record = bad_record(source, lineno, raw, str(exc))
                    series[0].add_bad(record, lineno)
                    continue
                for column in range(1, width):
                    one = series[column - 1]
                    try:
                        mean = number(avg[column], header[column], maximum=_MAX_PERCENT) / 100.0
                        top = number(peak[column], header[column], maximum=_MAX_PERCENT) / 100.0
                    except RowError as exc:
                        one.add_bad(bad_record(self.avg_file, lineno, avg_raw, str(exc)), lineno)
                        continue
                    one.add(start, lineno, mean, top)
        yield from _emit(series, self.pool)


# ------------------------------------------------------------ google-2011-gcd

_GCD_FILE = re.compile(r"vm_(?P<job>\d+)_(?P<day>[1-9]\d*)")


def _gcd_files(path: Path) -> list[tuple[Path, str, int]]:
    entries = [path] if path.is_file() else sorted(path.iterdir())
    found = []
    for entry in entries:
        match = _GCD_FILE.fullmatch(entry.name)
        if match and entry.is_file():
            found.append((entry, match["job"], int(match["day"])))
    found.sort(key=lambda f: (f[2], int(f[1])))
    return found


def _gcd_reading(raw: bytes) -> tuple[float, float | None]:
    parts = raw.split()
    if len(parts) != 2:
        raise RowError(f"want 'cpu% mem%', got {len(parts)} fields")
    cpu = number(parts[0].decode("ascii"), "cpu%", maximum=_MAX_PERCENT) / 100.0
    mem = number(parts[1].decode("ascii"), "mem%", maximum=_MAX_PERCENT) / 100.0
    return cpu, mem


def sniff_gcd(path: Path) -> bool:
    if path.is_file():
        return _GCD_FILE.fullmatch(path.name) is not None
    return any(_GCD_FILE.fullmatch(p.name) for p in path.iterdir())


class GoogleGcd(Trace):
    """Google 2011 per-job-day usage (Ramezani et al.): ``cpu% mem%`` per 5 min line.

    File ``vm_<job>_<day>``: VM id = job id, line i (0-based) covers
    ``[(day-1)*86400 + i*300, ... + 300)``; a job's days form one series.
    """

    name = "google-2011-gcd"

    def __init__(self, path: Path, *, seed: int, pool: str) -> None:
        super().__init__(path, seed=seed, pool=pool)
        self.files = _gcd_files(path)
        if not self.files:
            raise TraceFormatError(path, "no vm_<job>_<day> files")

    def facts(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "time": "(day - 1) * 86400 + line * 300 + 300",
            "cpu": "cpu % / 100",
            "memory": "mem % / 100",
            "source": "Google cluster trace 2011, per job and day (Ramezani et al., TSC)",
            "licence": "cite Google's cluster-data and the paper",
        }

    def events(self) -> Iterator[TraceItem]:
        series = []
        for path, job, day in self.files:
            one = _Series(job)
            _read_readings(path, one, (day - 1) * DAY_S, _gcd_reading)
            series.append(one)
        yield from _emit(series, self.pool)


# ------------------------------------------------------------------ planetlab

_DAY_DIR = re.compile(r"\d{8}")


def _day(name: str) -> dt.date | None:
    if not _DAY_DIR.fullmatch(name):
        return None
    try:
        return dt.date(int(name[:4]), int(name[4:6]), int(name[6:]))
    except ValueError:
        return None


def _planetlab_days(path: Path) -> list[tuple[Path, dt.date]]:
    if not path.is_dir():
        return []
    own = _day(path.name)
    if own is not None and any(p.is_file() for p in path.iterdir()):
        return [(path, own)]
    days = []
    for entry in sorted(path.iterdir()):
        date = _day(entry.name)
        if date is not None and entry.is_dir():
            days.append((entry, date))
    return days


def _planetlab_reading(raw: bytes) -> tuple[float, float | None]:
    return number(raw.decode("ascii").strip(), "cpu%", maximum=_MAX_PERCENT) / 100.0, None


def sniff_planetlab(path: Path) -> bool:
    return bool(_planetlab_days(path))


class PlanetLab(Trace):
    """PlanetLab CoMon CPU traces (CloudSim set): day folders ``YYYYMMDD`` of per-VM files.

    One CPU % per line per 5 min; VM id = file name; time = days since the
    earliest day folder * 86400 + line * 300 + 300.
    """

    name = "planetlab"

    def __init__(self, path: Path, *, seed: int, pool: str) -> None:
        super().__init__(path, seed=seed, pool=pool)
        self.days = _planetlab_days(path)
        if not self.days:
            raise TraceFormatError(path, "no YYYYMMDD day folders")

    def facts(self) -> dict[str, Any]:
        return {
            "days": [date.isoformat() for _, date in self.days],
            "time": "(day - first day) * 86400 + line * 300 + 300",
            "cpu": "CPU % / 100",
            "source": "PlanetLab CoMon traces, CloudSim workload set",
            "licence": "see CloudSim",
        }

    def events(self) -> Iterator[TraceItem]:
        first = min(date for _, date in self.days)
        series = []
        for folder, date in self.days:
            base = (date - first).days * DAY_S
            for path in sorted(p for p in folder.iterdir() if p.is_file()):
                one = _Series(path.name)
                _read_readings(path, one, base, _planetlab_reading)
                series.append(one)
        yield from _emit(series, self.pool)
