"""orjson codec for the v1 schema, with validation at the edge.

``decode_event`` is the only door through which untrusted bytes enter lavad:
it either returns a fully validated event or raises ``SchemaError`` naming the
field, the offending value and the reason, so the caller can dead-letter the
record with that explanation and the original bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson
from pydantic import TypeAdapter, ValidationError

from lavad.streams.schema import EVENT_TYPES, SCHEMA_VERSION, Event

_ADAPTERS: Final[dict[str, TypeAdapter[Any]]] = {
    name: TypeAdapter(cls) for name, cls in EVENT_TYPES.items()
}


@dataclass(frozen=True, slots=True)
class SchemaError(Exception):
    """A record that does not decode or validate."""

    field: str
    value: object
    reason: str

    def __str__(self) -> str:
        shown = repr(self.value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        return f"{self.field}: {self.reason} (got {shown})"


def encode(obj: object) -> bytes:
    """Serialise an event or decision (any schema dataclass) to JSON bytes."""
    return orjson.dumps(obj)


# Larger than any valid event (64 features of 256 characters, 4096 usage
# samples); Kafka's own default message limit is about the same. Checked before
# parsing, so an oversized record costs a length check, not a parse.
MAX_RECORD_BYTES: Final = 1 << 20
# A SchemaError keeps at most this much of an offending string.
_MAX_SHOWN_CHARS: Final = 200


def decode_event(raw: bytes | str) -> Event:
    """Parse and validate one event. Raises ``SchemaError``; never returns junk."""
    size = len(raw)
    if isinstance(raw, str) and size > MAX_RECORD_BYTES // 4:
        size = len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_RECORD_BYTES:
        raise SchemaError(
            "<record>",
            _preview(raw[:_MAX_SHOWN_CHARS]),
            f"record of {size} bytes is larger than the {MAX_RECORD_BYTES}-byte limit",
        )
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SchemaError("<record>", _preview(raw), f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SchemaError("<record>", data, "an event must be a JSON object")
    return event_from_dict(data)


def event_from_dict(data: dict[str, Any]) -> Event:
    """Validate an already-parsed JSON object as an event."""
    version = data.get("v")
    if version is None:
        raise SchemaError("v", None, "missing schema version")
    # type(): True == 1.0 == 1 in Python, and neither is a version number.
    if type(version) is not int or version != SCHEMA_VERSION:
        raise SchemaError(
            "v", version, f"unsupported schema version (this build reads v{SCHEMA_VERSION})"
        )
    kind = data.get("type")
    adapter = _ADAPTERS.get(kind) if isinstance(kind, str) else None
    if adapter is None:
        raise SchemaError("type", kind, f"unknown event type; expected one of {sorted(_ADAPTERS)}")
    try:
        event: Event = adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        location = ".".join(str(part) for part in first["loc"]) or "<record>"
        reason = first["msg"]
        if first["type"] == "string_pattern_mismatch":
            # The only pattern in the schema refuses control characters.
            reason = "control characters (NUL, newline, DEL, ...) are not allowed"
        raise SchemaError(location, _shown(first.get("input")), reason) from None
    return event


def _shown(value: object) -> object:
    """The offending value, cut short: a 10 MB string is not kept to say it is too long."""
    if isinstance(value, str | bytes) and len(value) > _MAX_SHOWN_CHARS:
        return value[:_MAX_SHOWN_CHARS]
    return value


def _preview(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return text[:200]


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record a source could not turn into an event: dead-lettered, never dropped.

    ``source`` names the file or topic, ``position`` the line or
    partition/offset, ``raw`` holds the original bytes.
    """

    source: str
    position: str
    raw: bytes
    reason: str
