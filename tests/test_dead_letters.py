"""Dead letters are bounded: a record near the broker's size limit must not become a
dead letter the broker refuses on every retry (``deadletter.bounded``)."""

from __future__ import annotations

import base64

import orjson
import pytest

from lavad.streams.kafka.deadletter import (
    MAX_KEPT_KEY_BYTES,
    TRUNCATED,
    bounded,
    dead_letter_headers,
    header_map,
    record_json,
)

HEADERS = dead_letter_headers("decode", "not JSON", "lavad.vm-events", 3, 41)
# Names and contents of HEADERS: 12+8 + 11+6 + 18+15 + 22+1 + 19+2 = 114 bytes.
HEADER_BYTES = 114


def _size(key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> int:
    return (0 if key is None else len(key)) + len(value) + sum(len(n) + len(c) for n, c in headers)


def test_the_headers_weigh_what_the_table_says() -> None:
    assert _size(None, b"", HEADERS) == HEADER_BYTES


@pytest.mark.parametrize(
    ("key", "value_bytes"),
    [
        # 4 + 4,882 + 114 = 5,000: exactly at the bound, kept whole.
        (b"east", 4_882),
        (None, 4_886),
        (b"", 0),
    ],
)
def test_a_dead_letter_within_the_bound_is_the_record_byte_for_byte(
    key: bytes | None, value_bytes: int
) -> None:
    value = b"v" * value_bytes
    assert bounded(key, value, HEADERS, 5_000) == (key, value, HEADERS)


@pytest.mark.parametrize(
    ("key", "value_bytes", "kept_key", "kept_value"),
    [
        # One byte over: the note "value=4883 key=4" (16 bytes) and its name
        # (15) come on top of the 114, so the value keeps 5,000 - 145 - 4.
        (b"east", 4_883, b"east", 4_851),
        # A 2 MB value: its note "value=2000000 key=4" is 19 bytes, 3 more.
        (b"east", 2_000_000, b"east", 4_848),
        # A hostile 50 kB key is cut to 1,024 bytes; the note is
        # "value=10 key=50000" (18 bytes): 5,000 - 114 - 15 - 18 - 1,024 = 3,829,
        # more than the value's 10 bytes, which stay whole.
        (b"k" * 50_000, 10, b"k" * MAX_KEPT_KEY_BYTES, 10),
        # No key: "value=9000 key=0" is 16 bytes, 5,000 - 145 = 4,855.
        (None, 9_000, None, 4_855),
    ],
)
def test_a_dead_letter_over_the_bound_is_cut_and_says_what_it_was(
    key: bytes | None, value_bytes: int, kept_key: bytes | None, kept_value: int
) -> None:
    value = bytes(range(256)) * (value_bytes // 256) + b"x" * (value_bytes % 256)
    new_key, new_value, headers = bounded(key, value, HEADERS, 5_000)
    assert new_key == kept_key
    assert new_value == value[:kept_value]
    assert headers[: len(HEADERS)] == HEADERS
    note = header_map(headers)[TRUNCATED]
    assert note == f"value={value_bytes} key={0 if key is None else len(key)}"
    assert _size(new_key, new_value, headers) <= 5_000


def test_a_record_shown_with_headers_keeps_its_bytes() -> None:
    # UTF-8 comes out as text; anything else as base64 that decodes to the same bytes.
    text = orjson.loads(record_json(b"east", b'{"v": 1}', HEADERS))
    assert text == {
        "headers": header_map(HEADERS),
        "key": "east",
        "value": '{"v": 1}',
    }
    raw = b"\xff\xfe\x00garbage"
    binary = orjson.loads(record_json(None, raw, HEADERS))
    assert binary["key"] is None
    assert "value" not in binary
    assert base64.b64decode(binary["value_base64"]) == raw
    assert binary["headers"]["lavad.reason"] == "not JSON"
