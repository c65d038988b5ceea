"""The JSON-lines reader keeps time non-decreasing by refusing as few events as it can.

The real cases restamp one or two events of the bundled OpenB slice, converted
to canonical JSON lines, as a bad producer would (milliseconds written as
seconds, a clock a day ahead). A reader that refuses only the events earlier
than their predecessor refuses every event after such a record as "out of
order", and the rest of the file goes to the dead letters.
The properties hold the rule to its promise on any times: time never goes
back, every line comes out exactly once, in line order.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.adapters.jsonl import order_refusals
from lavad.streams.codec import BadRecord
from lavad.streams.schema import VmExit
from lavad.streams.trace_tools import convert

ROOT = Path(__file__).resolve().parents[1]
OPENB_SLICE = ROOT / "data" / "alibaba-openb-slice"


@pytest.fixture(scope="module")
def openb_lines(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    out = tmp_path_factory.mktemp("jsonl") / "openb.jsonl"
    convert(OPENB_SLICE, out)
    return out.read_bytes().splitlines()


def _restamped(lines: list[bytes], index: int, time: float) -> bytes:
    record = orjson.loads(lines[index])
    record["time"] = time
    return orjson.dumps(record)


def _first_request_after(lines: list[bytes], start: int) -> int:
    """The index of the first vm.request at or after ``start`` (requests have exits)."""
    return next(
        i for i in range(start, len(lines)) if orjson.loads(lines[i])["type"] == "vm.request"
    )


def _replayed(path: Path) -> tuple[bytes, list[dict[str, object]]]:
    settings_ = load_settings(ROOT / "config" / "lavad.toml")
    trace = open_trace(path)
    config = settings_.engine_config("bestfit", trace_has_hosts=trace.has_hosts)
    decisions, dead = io.BytesIO(), io.BytesIO()
    replay(
        trace.events(), config, end_time=trace.end_time, decisions_out=decisions,
        dead_letters_out=dead,
    )  # fmt: skip
    return decisions.getvalue(), [orjson.loads(x) for x in dead.getvalue().splitlines()]


@pytest.mark.parametrize("scale", [1000.0, None], ids=["milliseconds-as-seconds", "a-day-ahead"])
def test_one_record_stamped_ahead_is_refused_alone(
    openb_lines: list[bytes], tmp_path: Path, scale: float | None
) -> None:
    index = _first_request_after(openb_lines, len(openb_lines) // 2)
    time = orjson.loads(openb_lines[index])["time"]
    ahead = time * scale if scale is not None else time + 86_400.0
    lines = list(openb_lines)
    lines[index] = _restamped(lines, index, ahead)
    path = tmp_path / "restamped.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")

    items = list(open_trace(path).events())
    bad = [item for item in items if isinstance(item, BadRecord)]
    assert [b.position for b in bad] == [f"line {index + 1}"]
    assert "later than 8 of the next 8 events of its pool" in bad[0].reason
    # Every other event comes through as the untouched file has it.
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b"\n".join(openb_lines) + b"\n")
    untouched = list(open_trace(clean).events())
    assert [i for i in items if not isinstance(i, BadRecord)] == (
        untouched[:index] + untouched[index + 1 :]
    )
    # Replayed, the refused request costs its own exit ("unknown VM") and nothing more.
    _, dead = _replayed(path)
    assert len(dead) == 2
    assert "out of order" in str(dead[0]["reason"])
    assert "unknown VM" in str(dead[1]["reason"])


def test_a_run_of_records_stamped_ahead_is_refused_and_the_rest_decided(
    openb_lines: list[bytes], tmp_path: Path
) -> None:
    first = _first_request_after(openb_lines, len(openb_lines) // 3)
    second = _first_request_after(openb_lines, first + 1)
    lines = list(openb_lines)
    for index in (first, second):
        time = orjson.loads(lines[index])["time"]
        lines[index] = _restamped(lines, index, time * 1000.0)
    path = tmp_path / "restamped.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    decisions, dead = _replayed(path)
    assert len(dead) == 4  # two requests, their two exits
    assert sum("out of order" in str(d["reason"]) for d in dead) == 2
    # Every other request was decided: the slice's decisions less the two refused.
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b"\n".join(openb_lines) + b"\n")
    untouched, _ = _replayed(clean)
    placement = b'"kind":"placement"'
    assert untouched.count(placement) > 1000
    assert decisions.count(placement) == untouched.count(placement) - 2


def test_a_capture_of_interleaved_pools_replays_as_the_time_ordered_file(
    openb_lines: list[bytes], tmp_path: Path
) -> None:
    # The slice as three pools, merged by time, is what producers publish; an
    # input topic read back partition by partition (``lavad tail``) holds the
    # same records, each pool's in its order, the pools one after another.
    pools = ("east", "west", "north")
    records = [orjson.loads(line) | {"pool": pool} for pool in pools for line in openb_lines]
    ordered = sorted(records, key=lambda r: r["time"])  # stable: each pool's order kept
    captured = [r for pool in reversed(pools) for r in records if r["pool"] == pool]
    timed, tailed = tmp_path / "ordered.jsonl", tmp_path / "captured.jsonl"
    timed.write_bytes(b"\n".join(orjson.dumps(r) for r in ordered) + b"\n")
    tailed.write_bytes(b"\n".join(orjson.dumps(r) for r in captured) + b"\n")
    # Equal times of different pools come in line order, so the files differ
    # there; each pool's events, and its decisions, are the same.
    for pool in pools:
        assert _of_pool(open_trace(tailed).events(), pool) == _of_pool(
            open_trace(timed).events(), pool
        )
    decisions, dead = _replayed(tailed)
    assert dead == []
    expected, _ = _replayed(timed)
    for pool in pools:
        assert _of_pool(decisions.splitlines(), pool) == _of_pool(expected.splitlines(), pool)
    assert len(decisions.splitlines()) == len(expected.splitlines()) > 3 * 1000


def _of_pool(items: Iterable[object], pool: str) -> list[object]:
    """``items`` (events, or decisions as JSON lines) of ``pool``, in their order."""
    return [
        i for i in items
        if (orjson.loads(i)["pool"] if isinstance(i, bytes) else getattr(i, "pool", None)) == pool
    ]  # fmt: skip


def _file(tmp_path: Path, rows: list[tuple[str, float] | None]) -> Path:
    """A file of exits of ``(pool, time)``, None a line that is not JSON; line n's VM is vm-n."""
    lines = [
        b"{not json" if row is None
        else orjson.dumps(VmExit(time=row[1], pool=row[0], vm_id=f"vm-{n}"))
        for n, row in enumerate(rows, start=1)
    ]  # fmt: skip
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _positions(items: list[object]) -> list[str]:
    return [
        i.position if isinstance(i, BadRecord) else f"line {i.vm_id.removeprefix('vm-')}"  # type: ignore[attr-defined]
        for i in items
    ]


@pytest.mark.parametrize(
    ("times", "refused"),
    [
        # 1, 5, 2, 6, 7: letting 5 through refuses only 2, refusing 5 costs one
        # too: 5 stays, the late 2 goes.
        ([1.0, 5.0, 2.0, 6.0, 7.0], [2]),
        # 1, 5, 2, 3, 6: letting 5 through refuses 2 and 3; refusing it costs one.
        ([1.0, 5.0, 2.0, 3.0, 6.0], [1]),
        # At the end of the pool nothing follows to weigh against: 9 stays, 4 goes.
        ([1.0, 9.0, 4.0], [2]),
        # Equal times are in order.
        ([3.0, 3.0, 3.0], []),
        # The largest float and infinity (JSON's 1e400): refused like any record ahead.
        ([1.0, 1.7976931348623157e308, 2.0, 3.0], [1]),
        ([1.0, float("inf"), 2.0, 3.0, float("inf")], [1]),
        # A run of six stamped ahead is refused by itself; the eight after weigh it.
        ([1.0, *[1e9] * 6, *[2.0 + k for k in range(8)]], [1, 2, 3, 4, 5, 6]),
    ],
)
def test_order_refusals(times: list[float], refused: list[int]) -> None:
    reasons = order_refusals(times)
    assert [i for i, r in enumerate(reasons) if r is not None] == refused
    assert all("out of order" in r for r in reasons if r is not None)


def test_order_refusals_refuses_a_lookahead_it_cannot_use() -> None:
    with pytest.raises(ValueError, match="lookahead"):
        order_refusals([1.0], lookahead=0)


def test_one_pools_late_event_is_refused_and_another_pools_earlier_events_are_not(
    tmp_path: Path,
) -> None:
    # Pool a: 10, 20, 15 (late), 30. Pool b, after them in the file: 5, 12.
    path = _file(tmp_path, [("a", 10.0), ("a", 20.0), ("a", 15.0), ("a", 30.0), ("b", 5.0),
                            ("b", 12.0), None])  # fmt: skip
    items = list(open_trace(path).events())
    # Merged by time: b's 5 first; a's late 15 refused after the event on the line
    # before it (a's 20), the bad line after b's 12.
    assert _positions(items) == ["line 5", "line 1", "line 6", "line 7", "line 2", "line 3",
                                 "line 4"]  # fmt: skip
    bad, late = (i for i in items if isinstance(i, BadRecord))
    assert "out of order: time 15.0 after 20.0" in late.reason
    assert "not valid JSON" in bad.reason


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.sampled_from("abc"), st.floats(0.0, 1e9, allow_nan=False)),
            st.none(),  # a line that does not decode
        ),
        max_size=50,
    )
)
def test_time_never_goes_back_each_pool_keeps_its_order_and_every_line_comes_out_once(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[str, float] | None]
) -> None:
    path = _file(tmp_path_factory.mktemp("order"), rows)
    items = list(open_trace(path).events())
    assert sorted(_positions(items)) == sorted(f"line {n}" for n in range(1, len(rows) + 1))
    events = [i for i in items if isinstance(i, VmExit)]
    assert [e.time for e in events] == sorted(e.time for e in events)
    for pool in "abc":
        lines = [int(e.vm_id.removeprefix("vm-")) for e in events if e.pool == pool]
        assert lines == sorted(lines)
    # A file in time order loses nothing.
    if None not in rows and [r[1] for r in rows if r] == sorted(r[1] for r in rows if r):
        assert len(events) == len(rows)
