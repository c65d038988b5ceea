"""Dead-letter records: the original bytes as the value, the context in headers.

The value and key are the input record's, byte for byte, so a fixed record
can be re-published as it is; headers say why it was refused and where it
came from (the Kafka Connect convention).

Except when the record is too large to be a dead letter: the headers make a
dead letter larger than its record, and a broker refuses a record past its
``message.max.bytes`` (about 1 MB by default) on every attempt, so a record
within a few hundred bytes of the limit would stop the daemon's publishing
for good (a poison pill on the way out). Past ``max_bytes`` (key, value and
headers together) the key and value are cut to fit, and the header
``lavad.truncated`` gives the value's and the key's original sizes; the
whole record stays at the source topic, partition and offset the headers
name, as long as that topic retains it.
"""

from __future__ import annotations

import base64
from typing import Protocol

import orjson

REASON = "lavad.reason"
STAGE = "lavad.stage"
SOURCE_TOPIC = "lavad.source.topic"
SOURCE_PARTITION = "lavad.source.partition"
SOURCE_OFFSET = "lavad.source.offset"
TRUNCATED = "lavad.truncated"

# The default bound of a dead letter: under Kafka's default message.max.bytes
# (1,048,588) with room for the record batch's own framing.
DEFAULT_MAX_BYTES = 1_000_000
# A key kept whole up to this size when a dead letter must be cut: input keys
# are pool names, far shorter; a longer one is hostile and is cut as well.
MAX_KEPT_KEY_BYTES = 1024

Headers = list[tuple[str, bytes]]


def dead_letter_headers(
    stage: str, reason: str, topic: str, partition: int, offset: int
) -> Headers:
    return [
        (REASON, reason.encode("utf-8", "replace")),
        (STAGE, stage.encode()),
        (SOURCE_TOPIC, topic.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
    ]


def header_map(headers: tuple[tuple[str, bytes], ...] | Headers) -> dict[str, str]:
    return {name: value.decode("utf-8", "replace") for name, value in headers}


def record_json(
    key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...] | Headers
) -> bytes:
    """One record as a JSON object (``lavad tail --headers``): its headers, key and value.

    The key and value are text where they are UTF-8, else base64 under
    ``key_base64`` or ``value_base64``: a dead letter's bytes are often not
    text, and shown with replacement characters they could not be re-published
    as they came.
    """
    shown: dict[str, object] = {"headers": header_map(headers)}
    for name, data in (("key", key), ("value", value)):
        if data is None:
            shown[name] = None
            continue
        try:
            shown[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            shown[f"{name}_base64"] = base64.b64encode(data).decode("ascii")
    return orjson.dumps(shown)


def bounded(
    key: bytes | None, value: bytes, headers: Headers, max_bytes: int
) -> tuple[bytes | None, bytes, Headers]:
    """``key``, ``value`` and ``headers`` of a dead letter of at most ``max_bytes``.

    Under the bound they are returned as they are. Over it, the key keeps at
    most ``MAX_KEPT_KEY_BYTES`` and the value what room is left, and a
    ``lavad.truncated`` header says ``value=<bytes> key=<bytes>`` of the
    original. ``max_bytes`` must leave room for the headers and the kept key
    (the settings hold it at 4 KiB or more; the headers are short).
    """
    key_size = 0 if key is None else len(key)
    header_size = sum(len(name) + len(content) for name, content in headers)
    if key_size + len(value) + header_size <= max_bytes:
        return key, value, headers
    note = f"value={len(value)} key={key_size}".encode()
    headers = [*headers, (TRUNCATED, note)]
    kept_key = None if key is None else key[:MAX_KEPT_KEY_BYTES]
    room = max_bytes - (header_size + len(TRUNCATED) + len(note)) - len(kept_key or b"")
    return kept_key, value[: max(room, 0)], headers


class ConsumedRecord(Protocol):
    """What a dead letter reads of a consumed record (aiokafka's ``ConsumerRecord``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


def dead_letter_of(
    record: ConsumedRecord, stage: str, reason: str, max_bytes: int = DEFAULT_MAX_BYTES
) -> tuple[bytes | None, bytes, Headers]:
    """The key, value and headers of ``record``'s dead letter, ``bounded`` by ``max_bytes``."""
    headers = dead_letter_headers(stage, reason, record.topic, record.partition, record.offset)
    return bounded(record.key, record.value or b"", headers, max_bytes)
