"""The edge: every malformed record names the field, the value and the reason."""

from __future__ import annotations

import orjson
import pytest

from lavad.streams.codec import SchemaError, decode_event, encode
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
