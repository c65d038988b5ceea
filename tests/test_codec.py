"""The edge: every malformed record names the field, the value and the reason."""

from __future__ import annotations

import orjson
import pytest

from lavad.streams.codec import MAX_RECORD_BYTES, SchemaError, decode_event, encode
from lavad.streams.schema import EVENT_TYPES, UsageSample, UsageStats, VmRequest

GOOD = {
    "v": 1,
    "type": "vm.request",
    "time": 300.0,
    "pool": "p",
    "vm_id": "az-1-0",
    "cores": 2.0,
    "memory_gib": 3.5,
}


def test_round_trip_of_every_field() -> None:
    request = VmRequest(
        time=1.0,
        pool="p",
        vm_id="v",
        cores=0.5,
        memory_gib=1.75,
        gpus=0.46,
        deployment="d",
        max_per_host=2,
        features={"qos": "LS", "batch_size": 3},
    )
    assert decode_event(encode(request)) == request
    usage = UsageSample(
        time=300.0,
        pool="p",
        vm_id="v",
        interval_s=300.0,
        cpu=UsageStats(mean=0.2, peak=0.9, samples=(0.1, 0.3)),
    )
    assert decode_event(encode(usage)) == usage


def test_every_event_type_is_registered_once() -> None:
    assert len(EVENT_TYPES) == 10
    assert all(
        cls.__dataclass_fields__["type"].default == name for name, cls in EVENT_TYPES.items()
    )


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"v": None}, "v", "missing schema version"),
        ({"v": 2}, "v", "unsupported schema version"),
        ({"type": "vm.teleport"}, "type", "unknown event type"),
        ({"cores": -2}, "cores", "greater than 0"),
        ({"cores": 0}, "cores", "greater than 0"),
        ({"memory_gib": "lots"}, "memory_gib", "valid number"),
        ({"time": None}, "time", "valid number"),  # orjson writes NaN as null
        ({"time": -1.0}, "time", "greater than or equal to 0"),
        ({"vm_id": ""}, "vm_id", "at least 1 character"),
        ({"max_per_host": 0}, "max_per_host", "greater than or equal to 1"),
        ({"vm_id": None}, "vm_id", "valid string"),
    ],
)
def test_invalid_records_name_field_and_reason(
    change: dict[str, object], field: str, reason: str
) -> None:
    record = {**GOOD, **change}
    if change.get("v", 1) is None:
        del record["v"]
    with pytest.raises(SchemaError) as caught:
        decode_event(orjson.dumps(record))
    assert caught.value.field == field
    assert reason in caught.value.reason


def test_missing_field_is_named() -> None:
    record = dict(GOOD)
    del record["cores"]
    with pytest.raises(SchemaError) as caught:
        decode_event(orjson.dumps(record))
    assert (caught.value.field, caught.value.reason) == ("cores", "Field required")


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"", b"\xff\xfe"])
def test_not_an_object(raw: bytes) -> None:
    with pytest.raises(SchemaError) as caught:
        decode_event(raw)
    assert caught.value.field == "<record>"


# JSON is UTF-8 text. msgspec raised UnicodeDecodeError, not a SchemaError,
# for bytes that are not UTF-8 inside a string it keeps (and the live intake
# let it through, stopping the daemon on the record), and skipped them in a
# field it does not know. Every such record is refused, saying where.
GOOD_BYTES = orjson.dumps({**GOOD, "tenant": "t", "features": {"k": "x"}})


@pytest.mark.parametrize(
    ("good", "bad", "why"),
    [
        (b'"az-1-0"', b'"az-\xff"', "invalid start byte"),  # in the VM's id
        (b'"k"', b'"\xc3"', "invalid continuation byte"),  # a feature's name cut short
        (b'"x"', b'"\xc0\xaf"', "invalid start byte"),  # an overlong "/"
        (b'"t"', b'"\xed\xa0\x80"', "invalid continuation byte"),  # a surrogate
        (b'{"v"', b'{"n\x80te":1,"v"', "invalid start byte"),  # a key no event has
    ],
)
def test_bytes_that_are_not_utf8_are_refused(good: bytes, bad: bytes, why: str) -> None:
    raw = GOOD_BYTES.replace(good, bad)
    # Every other byte is ASCII: the first one that is not is where it breaks.
    at = next(i for i, byte in enumerate(raw) if byte >= 0x80)
    # Spaced out, the record misses the fast path for lavad's own encoding.
    for record, offset in ((raw, at), (raw.replace(b",", b", "), at + raw[:at].count(b","))):
        with pytest.raises(SchemaError) as caught:
            decode_event(record)
        assert caught.value.field == "<record>"
        assert caught.value.reason == f"not valid UTF-8: {why} at byte {offset}"


def test_text_with_a_lone_surrogate_is_refused() -> None:
    text = GOOD_BYTES.decode().replace("az-1-0", "az-\ud800")
    with pytest.raises(SchemaError) as caught:
        decode_event(text)
    at = text.index("\ud800")
    reason = f"not encodable as UTF-8: surrogates not allowed at character {at}"
    assert caught.value.reason == reason
    # What the refusal shows can itself be written as UTF-8 (a dead letter's header).
    str(caught.value).encode("utf-8")


def test_utf8_text_beyond_ascii_decodes() -> None:
    vm_id, features = "vm-\u00e9-\u65e5\u672c", {"r\u00e9gion": "Z\u00fcrich"}
    event = decode_event(orjson.dumps({**GOOD, "vm_id": vm_id, "features": features}))
    assert (event.vm_id, event.features) == (vm_id, features)


# One valid record of every event type: strict decoding must still take them,
# ints where floats are expected included.
VALID = {
    "vm.request": {
        **GOOD,
        "cores": 2,
        "disk_gib": 10,
        "tenant": "t" * 256,
        "deployment": "d",
        "flavor": "Standard_D2",
        "max_per_host": 1,
        "features": {f"k{i}": i for i in range(64)},
    },
    "vm.exit": {"v": 1, "type": "vm.exit", "time": 1, "pool": "p", "vm_id": "v" * 256},
    "vm.placed": {
        "v": 1,
        "type": "vm.placed",
        "time": 2.5,
        "pool": "p",
        "vm_id": "v/é☃",
        "host_id": "h",
        "cores": 1,
        "memory_gib": 0,
        "features": {"qos": "LS", "burst": True, "share": 0.5},
    },
    "host.up": {
        "v": 1,
        "type": "host.up",
        "time": 0,
        "pool": "p",
        "host_id": "h",
        "cores": 48,
        "memory_gib": 192.0,
        "labels": {"rack": "r1", "zone": "z" * 256},
    },
    "host.down": {"v": 1, "type": "host.down", "time": 0, "pool": "p", "host_id": "h"},
    "host.drain": {"v": 1, "type": "host.drain", "time": 0, "pool": "p", "host_id": "h"},
    "deployment.arrival": {
        "v": 1,
        "type": "deployment.arrival",
        "time": 0,
        "pool": "p",
        "deployment_id": "d",
        "cores": 0,
        "tenant": "t",
        "features": {"gpu": False},
    },
    "deployment.scale_out": {
        "v": 1,
        "type": "deployment.scale_out",
        "time": 0,
        "pool": "p",
        "deployment_id": "d",
        "cores": 4,
    },
    "deployment.scale_in": {
        "v": 1,
        "type": "deployment.scale_in",
        "time": 0,
        "pool": "p",
        "deployment_id": "d",
        "cores": 4,
        "memory_gib": 8,
    },
    "usage": {
        "v": 1,
        "type": "usage",
        "time": 300,
        "pool": "p",
        "vm_id": "v",
        "interval_s": 300,
        "cpu": {"mean": 0, "peak": 1, "samples": [0, 0.5, 1]},
        "memory": {"mean": 0.25, "peak": 0.5, "samples": []},
    },
}


@pytest.mark.parametrize("kind", sorted(EVENT_TYPES))
def test_a_valid_record_of_every_type_decodes(kind: str) -> None:
    event = decode_event(orjson.dumps(VALID[kind]))
    assert type(event) is EVENT_TYPES[kind]
    # Every field given comes back as given (JSON: 2 == 2.0; an int stays an int
    # where it is one, and true stays true, not 1).
    again = orjson.loads(encode(event))
    for key, value in VALID[kind].items():
        assert again[key] == value
        assert isinstance(again[key], bool) == isinstance(value, bool)


_TEN_MB = "x" * (10 * 1024 * 1024)

# (event type, changed fields, field named, words of the reason). Each was
# accepted by the lenient decoder (coerced, or kept however large).
LENIENT = [
    ("vm.request", {"cores": True}, "cores", "valid number"),
    ("vm.request", {"cores": "8"}, "cores", "valid number"),
    ("vm.request", {"memory_gib": "3.5"}, "memory_gib", "valid number"),
    ("vm.request", {"time": False}, "time", "valid number"),
    ("vm.request", {"time": "300"}, "time", "valid number"),
    ("vm.request", {"max_per_host": True}, "max_per_host", "valid integer"),
    ("vm.request", {"max_per_host": "2"}, "max_per_host", "valid integer"),
    ("vm.request", {"max_per_host": 2.0}, "max_per_host", "valid integer"),
    ("vm.request", {"v": True}, "v", "unsupported schema version"),
    ("vm.request", {"v": 1.0}, "v", "unsupported schema version"),
    ("vm.request", {"vm_id": "a\x00b"}, "vm_id", "control characters"),
    ("vm.request", {"vm_id": "a\nb"}, "vm_id", "control characters"),
    ("vm.request", {"pool": "p\x7f"}, "pool", "control characters"),
    ("vm.request", {"tenant": "t" * 257}, "tenant", "at most 256 characters"),
    ("vm.request", {"deployment": "d" * 257}, "deployment", "at most 256 characters"),
    ("vm.request", {"flavor": "f" * 257}, "flavor", "at most 256 characters"),
    ("vm.request", {"tenant": "t\x00"}, "tenant", "control characters"),
    ("vm.request", {"tenant": _TEN_MB}, "<record>", "1048576-byte limit"),
    ("vm.request", {"features": {f"k{i}": 1 for i in range(65)}}, "features", "at most 64"),
    ("vm.request", {"features": {"k" * 129: 1}}, "features", "at most 128 characters"),
    ("vm.request", {"features": {"k": "x" * 257}}, "features.k", "at most 256 characters"),
    ("vm.placed", {"host_id": "h\x00"}, "host_id", "control characters"),
    ("vm.placed", {"cores": "1"}, "cores", "valid number"),
    ("host.up", {"memory_gib": True}, "memory_gib", "valid number"),
    ("host.up", {"labels": {f"l{i}": "x" for i in range(65)}}, "labels", "at most 64"),
    ("host.up", {"labels": {"rack": "r" * 257}}, "labels.rack", "at most 256 characters"),
    ("host.down", {"host_id": "\x00"}, "host_id", "control characters"),
    ("deployment.arrival", {"deployment_id": "d\x1b[31m"}, "deployment_id", "control"),
    ("deployment.arrival", {"tenant": "t" * 257}, "tenant", "at most 256 characters"),
    ("deployment.scale_out", {"cores": "4"}, "cores", "valid number"),
    ("deployment.scale_in", {"cores": True}, "cores", "valid number"),
    ("usage", {"interval_s": "300"}, "interval_s", "valid number"),
    ("usage", {"cpu": {"mean": True, "peak": 1}}, "cpu.mean", "valid number"),
    ("usage", {"cpu": {"mean": 0, "peak": 1, "samples": ["1"]}}, "cpu.samples.0", "number"),
    ("usage", {"cpu": {"mean": 0, "peak": 1, "samples": [0] * 4097}}, "cpu.samples", "at most"),
]


# Refused before strict decoding too; kept so that it stays so.
STILL_REFUSED = [
    ("vm.request", {"vm_id": "v" * 257}, "vm_id", "at most 256 characters"),
    ("vm.request", {"pool": "p" * 257}, "pool", "at most 256 characters"),
    ("vm.request", {"tenant": 7}, "tenant", "valid string"),
    ("vm.request", {"features": {"k": [1]}}, "features.k", "valid"),
    ("host.up", {"labels": {"rack": 1}}, "labels.rack", "valid string"),
]


# Quantities and usage past any fleet's: the engine's arithmetic on them had
# overflowed (a usage of 1e300 times the request stopped it on the record).
PAST_BOUNDS = [
    ("vm.request", {"cores": 1.5e9}, "cores", "less than or equal to 1000000000"),
    ("vm.request", {"memory_gib": 1e300}, "memory_gib", "less than or equal to"),
    ("vm.placed", {"gpus": 2e9}, "gpus", "less than or equal to"),
    ("host.up", {"disk_gib": 1e10}, "disk_gib", "less than or equal to"),
    ("deployment.arrival", {"cores": 1e300}, "cores", "less than or equal to"),
    ("deployment.scale_out", {"memory_gib": 2e9}, "memory_gib", "less than or equal to"),
    ("usage", {"interval_s": 2e9}, "interval_s", "less than or equal to 1000000000"),
    ("usage", {"cpu": {"mean": 0, "peak": 1e300}}, "cpu.peak", "less than or equal to 1000000"),
    ("usage", {"cpu": {"mean": 0, "peak": 1, "samples": [0, 2e6]}}, "cpu.samples.1", "less"),
]


@pytest.mark.parametrize(
    ("kind", "change", "field", "reason"),
    [pytest.param(*case, id=f"lenient-{n}") for n, case in enumerate(LENIENT)]
    + [pytest.param(*case, id=f"still-{n}") for n, case in enumerate(STILL_REFUSED)]
    + [pytest.param(*case, id=f"bound-{n}") for n, case in enumerate(PAST_BOUNDS)],
)
def test_lenient_decoding_is_refused(
    kind: str, change: dict[str, object], field: str, reason: str
) -> None:
    with pytest.raises(SchemaError) as caught:
        decode_event(orjson.dumps({**VALID[kind], **change}))
    assert caught.value.field.startswith(field), caught.value
    assert reason in caught.value.reason, caught.value
    # The error keeps a bounded preview, not the 10 MB it refused.
    assert len(str(caught.value)) < 1000


def test_an_oversized_record_is_refused_before_parsing() -> None:
    # Not even JSON: the size alone refuses it.
    with pytest.raises(SchemaError) as caught:
        decode_event(b"{" * (MAX_RECORD_BYTES + 1))
    assert caught.value.field == "<record>"
    assert "limit" in caught.value.reason
    # As text, the size counts in UTF-8 bytes, not characters.
    record = orjson.dumps({**GOOD, "tenant": "é" * (MAX_RECORD_BYTES // 2)}).decode()
    assert len(record) < MAX_RECORD_BYTES
    with pytest.raises(SchemaError, match="limit"):
        decode_event(record)


# The decoder reads records ending as lavad's encoder ends them in one pass;
# these must still be refused exactly as the step-by-step path refuses them.
ENDINGS_REFUSED = [
    # No version, and a type that is only a feature's key: both fields default
    # in the dataclass, so only the step-by-step path notices.
    (b'{"time":1,"pool":"p","vm_id":"v","type":"vm.exit"}', "v", "missing schema version"),
    (
        b'{"v":1,"time":1,"pool":"p","vm_id":"v","cores":1,"memory_gib":1,'
        b'"features":{"type":"vm.request"}}',
        "type",
        "unknown event type",
    ),
    (b'{"time":1,"pool":"p","vm_id":"v","type":"vm.exit","v":true}', "v", "unsupported"),
    (b'{"time":1,"pool":"p","vm_id":"v\\n","type":"vm.exit","v":1}', "vm_id", "control"),
    (b'{"time":1,"pool":"p\\u0085","vm_id":"v","type":"vm.exit","v":1}', "pool", "control"),
    ('{"time":1,"pool":"p\x85","vm_id":"v","type":"vm.exit","v":1}'.encode(), "pool", "control"),
    (b'{"time":1,"pool":"p\x7f","vm_id":"v","type":"vm.exit","v":1}', "pool", "control"),
    (b'{"time":1e400,"pool":"p","vm_id":"v","type":"vm.exit","v":1}', "time", "finite"),
]


@pytest.mark.parametrize(("raw", "field", "reason"), ENDINGS_REFUSED)
def test_records_ending_like_lavads_are_checked_in_full(
    raw: bytes, field: str, reason: str
) -> None:
    with pytest.raises(SchemaError) as caught:
        decode_event(raw)
    assert caught.value.field == field
    assert reason in caught.value.reason


@pytest.mark.parametrize("kind", sorted(EVENT_TYPES))
def test_another_producers_field_order_and_spacing_decode_the_same(kind: str) -> None:
    ours = decode_event(orjson.dumps(VALID[kind]))
    theirs = dict(reversed(list(VALID[kind].items())))
    assert decode_event(orjson.dumps(theirs, option=orjson.OPT_INDENT_2)) == ours
    assert decode_event(orjson.dumps(VALID[kind]).decode()) == ours
