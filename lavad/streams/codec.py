"""orjson/msgspec codec for the v1 schema, with validation at the edge.

``decode_event`` is the only door through which untrusted bytes enter lavad:
it either returns a fully validated event or raises ``SchemaError`` naming the
field, the offending value and the reason, so the caller can dead-letter the
record with that explanation and the original bytes.

Decoding is msgspec's, strict (no bool or string for a number, no float for
an integer), straight into the frozen event dataclasses with the constraints
their field annotations carry (``streams/schema.py``): one pass that parses,
validates and builds, about ten times cheaper than parsing to a dict and
validating that. The first pass reads only ``v`` and ``type`` (skipping the
rest), so a record of another version or an unknown type is refused for that
before any of its fields. Only a refused record pays for the explanation:
msgspec's message is reworded and the offending value looked up.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Union

import msgspec
import orjson

from lavad.streams.schema import (
    EVENT_TYPES,
    NO_CONTROL_CHARS,
    SCHEMA_VERSION,
    Event,
    NoControlChars,
)


class _Header(msgspec.Struct):
    """What decides how the rest of a record is read; every other field is skipped."""

    v: Any = None
    type: Any = None


_HEADER: Final = msgspec.json.Decoder(_Header)
_DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    name: msgspec.json.Decoder(cls, strict=True) for name, cls in EVENT_TYPES.items()
}
_TYPES: Final = sorted(EVENT_TYPES)
# How lavad's own encoder (orjson, fields in declaration order) ends a record:
# ``"type"`` then ``"v"``, the last two fields of every event. A record ending
# in exactly these bytes has both at its top level (a quote after a comma
# cannot be inside a string), with v the integer 1, so decoding it with its
# type's decoder is all the checking ``decode_event`` would do; any other
# record (another producer's field order, spacing, an error) takes the exact
# path, which gives the same event or the same refusal.
_ENDINGS: Final[dict[bytes, str]] = {
    f',"type":"{name}","v":{SCHEMA_VERSION}}}'.encode(): name for name in EVENT_TYPES
}
_ENDING_START: Final = b',"type":"'
_LONGEST_ENDING: Final = max(map(len, _ENDINGS))


def _marked_fields(cls: type[Any]) -> tuple[str, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(
        name
        for name, hint in hints.items()
        if typing.get_origin(hint) is Annotated
        and any(isinstance(mark, NoControlChars) for mark in hint.__metadata__)
    )


def _texts(cls: type[Any]) -> Callable[[Any], tuple[str, ...]]:
    """The event's strings that must hold no control characters, as one tuple."""
    names = _marked_fields(cls)
    getter: Callable[[Any], Any] = operator.attrgetter(*names)
    if len(names) == 1:
        return lambda event: (getter(event),)
    return getter


_CONTROLLED: Final[dict[str, tuple[tuple[str, ...], Callable[[Any], tuple[str, ...]]]]] = {
    name: (_marked_fields(cls), _texts(cls)) for name, cls in EVENT_TYPES.items()
}
_CONTROL: Final = re.compile(NO_CONTROL_CHARS)


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
    if type(raw) is bytes and len(raw) <= MAX_RECORD_BYTES:
        start = raw.rfind(_ENDING_START, -_LONGEST_ENDING)
        kind = _ENDINGS.get(raw[start:]) if start >= 0 else None
        if kind is not None:
            try:
                event: Event = _DECODERS[kind].decode(raw)
            except (msgspec.DecodeError, UnicodeDecodeError):
                # msgspec raises UnicodeDecodeError for bytes that are not
                # UTF-8 inside a string it keeps; the exact path says why.
                pass
            else:
                # A control character in a decoded string was written as an
                # escape, a raw DEL or a raw UTF-8 C1 (0xC2 0x80-0x9F): JSON
                # forbids raw C0 controls in strings. An ASCII record with no
                # backslash and no DEL cannot hold one (find: ~70 ns each).
                if raw.isascii():
                    if raw.find(b"\\") < 0 and raw.find(b"\x7f") < 0:
                        return event
                    return _checked(event, kind)
                # msgspec skips an unknown field without reading it as text, so
                # bytes that are not UTF-8 there decode; the exact path refuses
                # the record as the same bytes in a known field are refused.
                if _not_utf8(raw) is None:
                    return _checked(event, kind)
    return _decode_exact(raw)


def _not_utf8(raw: bytes | str) -> str | None:
    """Why ``raw`` is not UTF-8 text, the one encoding of JSON (RFC 8259, 8.1), or None.

    Text (``str``) fails when it holds a lone surrogate, which no UTF-8 spells.
    """
    try:
        if isinstance(raw, bytes):
            if not raw.isascii():
                raw.decode("utf-8")
        else:
            raw.encode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8: {exc.reason} at byte {exc.start}"
    except UnicodeEncodeError as exc:
        return f"not encodable as UTF-8: {exc.reason} at character {exc.start}"
    return None


def _decode_exact(raw: bytes | str) -> Event:
    """Every check in order: size, JSON, version, type, then the fields."""
    size = len(raw)
    if isinstance(raw, str) and size > MAX_RECORD_BYTES // 4:
        size = len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_RECORD_BYTES:
        raise SchemaError(
            "<record>",
            _preview(raw[:_MAX_SHOWN_CHARS]),
            f"record of {size} bytes is larger than the {MAX_RECORD_BYTES}-byte limit",
        )
    not_utf8 = _not_utf8(raw)
    if not_utf8 is not None:
        raise SchemaError("<record>", _preview(raw), not_utf8)
    try:
        header = _HEADER.decode(raw)
    except msgspec.ValidationError:
        raise SchemaError("<record>", _parsed(raw), "an event must be a JSON object") from None
    except msgspec.DecodeError as exc:
        raise SchemaError("<record>", _preview(raw), f"not valid JSON: {exc}") from None
    version = header.v
    if version is None:
        raise SchemaError("v", None, "missing schema version")
    # type(): True == 1.0 == 1 in Python, and neither is a version number.
    if type(version) is not int or version != SCHEMA_VERSION:
        raise SchemaError(
            "v", version, f"unsupported schema version (this build reads v{SCHEMA_VERSION})"
        )
    kind = header.type
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise SchemaError("type", _shown(kind), f"unknown event type; expected one of {_TYPES}")
    try:
        event = decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise _explain(str(exc), raw, EVENT_TYPES[kind]) from None
    return _checked(event, kind)


def _checked(event: Event, kind: str) -> Event:
    """The event, if its ids and names hold no control characters (else SchemaError)."""
    names, texts = _CONTROLLED[kind]
    joined = "".join(texts(event))
    # ASCII printable is exactly "no C0 control, no DEL"; only the rest needs the regex.
    if (joined.isascii() and joined.isprintable()) or _CONTROL.search(joined) is None:
        return event
    for name in names:
        text = getattr(event, name)
        if _CONTROL.search(text):
            raise SchemaError(name, _shown(text), _CONTROL_CHARS)
    raise AssertionError("unreachable: a control character was found in one of them")


# ------------------------------------------------------------ explanations

# msgspec's message, then where: "- at `$.cpu.samples[0]`" or "- at `key` in `$.labels`".
_WHERE: Final = re.compile(r"^(?P<message>.*?)(?: - at (?P<key>`key` in )?`(?P<path>\$[^`]*)`)?$")
_STEP: Final = re.compile(r"\.(\w+)|\[(\d+|\.\.\.)\]")
_BOUND: Final = re.compile(r"^Expected `(?:int|float)` (>=|>|<=|<) (\S+)$")
_LENGTH: Final = re.compile(r"^Expected `(str|object|array)` of length (>=|<=) (\d+)$")
_TYPE: Final = re.compile(r"^Expected `([^`]+)`, got `(\w+)`$")
_MISSING: Final = re.compile(r"^Object missing required field `(\w+)`$")
_COMPARED: Final = {
    ">=": "greater than or equal to",
    ">": "greater than",
    "<=": "less than or equal to",
    "<": "less than",
}
_NOUNS: Final = {
    "float": "number",
    "int": "integer",
    "str": "string",
    "bool": "boolean",
    "object": "object",
    "array": "array",
}
_CONTROL_CHARS: Final = "control characters (NUL, newline, DEL, ...) are not allowed"


def _explain(message: str, raw: bytes | str, cls: type[Any]) -> SchemaError:
    """msgspec's refusal as the field's dotted path, the offending value and the reason."""
    where = _WHERE.match(message)
    assert where is not None  # the pattern matches any message (every part optional)
    message = where["message"]
    data = _parsed(raw)
    names: list[str] = []
    value: Any = data
    hint: Any = cls
    for name, index in _STEP.findall(where["path"] or "$"):
        step: str | int = name or ("..." if index == "..." else int(index))
        hint = _inner(hint, step)
        if step == "..." and isinstance(value, dict):
            # msgspec does not say which entry: the first one that fails is it.
            step = _first_bad(value.items(), hint, by_key=False)
        names.append(str(step))
        value = _child(value, step)
    if where["key"] and isinstance(value, dict):
        value = _first_bad(value.items(), _key_hint(hint), by_key=True)
    missing = _MISSING.match(message)
    if missing:
        names.append(missing[1])
    field = ".".join(names) or "<record>"
    return SchemaError(field, _shown(value), _reason(message, missing is not None))


def _reason(message: str, missing: bool) -> str:
    if missing:
        return "Field required"
    if message == "Number out of range":
        return "Input should be a finite number"
    if bound := _BOUND.match(message):
        return f"Input should be {_COMPARED[bound[1]]} {bound[2]}"
    if length := _LENGTH.match(message):
        what, side, count = length.groups()
        if what == "str":
            unit = "character" if count == "1" else "characters"
            return f"String should have {'at least' if side == '>=' else 'at most'} {count} {unit}"
        unit = "entries" if what == "object" else "items"
        return f"should have {'at least' if side == '>=' else 'at most'} {count} {unit}"
    if expected := _TYPE.match(message):
        nouns = [_NOUNS.get(part, part) for part in expected[1].split(" | ") if part != "null"]
        wanted = nouns[0] if len(nouns) == 1 else ", ".join(nouns[:-1]) + " or " + nouns[-1]
        return f"Input should be a valid {wanted}, not {expected[2]}"
    return message


def _inner(hint: Any, step: str | int) -> Any:
    """The type found one step down from ``hint`` (a field name, an index, a dict entry)."""
    hint = _plain(hint)
    if isinstance(step, str) and step != "..." and dataclasses.is_dataclass(hint):
        return typing.get_type_hints(hint, include_extras=True).get(step, Any)
    args = typing.get_args(hint)
    if step == "..." and len(args) == 2:
        return args[1]  # dict[key, value]
    return args[0] if args else Any  # tuple[item, ...]


def _key_hint(hint: Any) -> Any:
    args = typing.get_args(_plain(hint))
    return args[0] if args else Any


def _plain(hint: Any) -> Any:
    """Without Annotated constraints and without ``| None``."""
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(members) == 1:
            return _plain(members[0])
    return hint


def _first_bad(items: Any, hint: Any, *, by_key: bool) -> Any:
    for key, value in items:
        try:
            msgspec.convert(key if by_key else value, hint, strict=True)
        except msgspec.ValidationError:
            return key
    return "..."


def _child(value: Any, step: str | int) -> Any:
    if isinstance(value, dict):
        return value.get(step)
    if isinstance(value, list) and isinstance(step, int) and step < len(value):
        return value[step]
    return None


def _parsed(raw: bytes | str) -> Any:
    """The record as plain JSON values, to show what was refused (refusals only)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _preview(raw)


def _shown(value: object) -> object:
    """The offending value, cut short: a 10 MB string is not kept to say it is too long."""
    if isinstance(value, str | bytes) and len(value) > _MAX_SHOWN_CHARS:
        return value[:_MAX_SHOWN_CHARS]
    if isinstance(value, dict | list) and len(value) > 8:
        return f"<{type(value).__name__} of {len(value)}>"
    return value


def _preview(raw: bytes | str) -> str:
    # What is not UTF-8 is replaced, not kept: the preview travels in a dead
    # letter's header. 200 characters take at most 800 bytes of UTF-8.
    if isinstance(raw, bytes):
        return raw[:800].decode("utf-8", "replace")[:200]
    return raw[:200].encode("utf-8", "replace").decode("utf-8")


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
