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


def decode_event(raw: bytes | str) -> Event:
    """Parse and validate one event. Raises ``SchemaError``; never returns junk."""
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
    if version != SCHEMA_VERSION:
        raise SchemaError(
            "v", version, f"unsupported schema version (this build reads v{SCHEMA_VERSION})"
        )
    kind = data.get("type")
    adapter = _ADAPTERS.get(kind) if isinstance(kind, str) else None
    if adapter is None:
        raise SchemaError("type", kind, f"unknown event type; expected one of {sorted(_ADAPTERS)}")
    try:
        event: Event = adapter.validate_python(data, strict=False)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        location = ".".join(str(part) for part in first["loc"]) or "<record>"
        raise SchemaError(location, first.get("input"), first["msg"]) from None
    return event


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
