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
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.adapters.jsonl import LOOKAHEAD_EVENTS, Line, in_order
from lavad.streams.codec import BadRecord
from lavad.streams.schema import VmExit, VmRequest
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
    assert "later than 8 of the 8 events after it" in bad[0].reason
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


def _event_line(lineno: int, time: float) -> Line:
    event = VmExit(time=time, pool="p", vm_id=f"vm-{lineno}")
    return lineno, orjson.dumps(event), event


def test_a_late_event_is_refused_itself_not_the_event_before_it() -> None:
    # 1, 5, 2, 6, 7: letting 5 through refuses only 2 (one event); refusing 5
    # would cost one too, so 5 stays and the late 2 goes.
    lines = [_event_line(n, t) for n, t in enumerate([1.0, 5.0, 2.0, 6.0, 7.0], start=1)]
    out = list(in_order(lines, "f"))
    assert [i.position for i in out if isinstance(i, BadRecord)] == ["line 3"]
    assert "out of order: time 2.0 after 5.0" in out[2].reason  # type: ignore[union-attr]


def test_two_late_events_cost_the_one_ahead_of_them() -> None:
    # 1, 5, 2, 3, 6: letting 5 through refuses 2 and 3; refusing 5 costs one.
    lines = [_event_line(n, t) for n, t in enumerate([1.0, 5.0, 2.0, 3.0, 6.0], start=1)]
    out = list(in_order(lines, "f"))
    assert [i.position for i in out if isinstance(i, BadRecord)] == ["line 2"]
    assert [i.time for i in out if isinstance(i, VmExit)] == [1.0, 2.0, 3.0, 6.0]


def test_bad_lines_between_events_keep_their_place_and_the_memory_stays_bounded() -> None:
    bad = [(n, b"x", BadRecord("f", f"line {n}", b"x", "not JSON")) for n in range(2, 5000)]
    lines: list[Line] = [_event_line(1, 9.0), *bad, _event_line(5000, 1.0)]
    out = list(in_order(lines, "f", max_held=100))
    # The event is judged on the lines held (no event after it within 100):
    # it goes through, the bad lines follow in order, then the late event is refused.
    assert isinstance(out[0], VmExit)
    assert [i.position for i in out[1:]] == [f"line {n}" for n in range(2, 5001)]


def test_in_order_refuses_a_lookahead_it_cannot_use() -> None:
    with pytest.raises(ValueError, match="lookahead"):
        list(in_order([], "f", lookahead=0))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(min_value=0.0, max_value=1e9, allow_nan=False),
            st.none(),  # a bad line
        ),
        max_size=60,
    ),
    st.integers(min_value=1, max_value=LOOKAHEAD_EVENTS),
)
def test_time_never_goes_back_and_every_line_comes_out_once_in_order(
    times: list[float | None], lookahead: int
) -> None:
    lines: list[Line] = []
    for n, t in enumerate(times, start=1):
        if t is None:
            lines.append((n, b"x", BadRecord("f", f"line {n}", b"x", "bad")))
        else:
            lines.append(_event_line(n, t))
    out = list(in_order(lines, "f", lookahead=lookahead))
    positions = [
        i.position if isinstance(i, BadRecord) else f"line {i.vm_id.removeprefix('vm-')}"  # type: ignore[union-attr]
        for i in out
    ]
    assert positions == [f"line {n}" for n in range(1, len(times) + 1)]
    kept = [i.time for i in out if not isinstance(i, BadRecord)]
    assert kept == sorted(kept)
    # Already in order: nothing is refused.
    if all(t is not None for t in times) and times == sorted(times):
        assert len(kept) == len(times)


def test_requests_come_through_as_decoded() -> None:
    request = VmRequest(time=1.0, pool="p", vm_id="a", cores=1.0, memory_gib=1.0)
    (out,) = in_order([(1, orjson.dumps(request), request)], "f")
    assert out == request
