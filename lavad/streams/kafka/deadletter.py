"""Dead-letter records: the original bytes as the value, the context in headers.

The value and key are the input record's, byte for byte, so a fixed record
can be re-published as it is; headers say why it was refused and where it
came from (the Kafka Connect convention).
"""

from __future__ import annotations

REASON = "lavad.reason"
STAGE = "lavad.stage"
SOURCE_TOPIC = "lavad.source.topic"
SOURCE_PARTITION = "lavad.source.partition"
SOURCE_OFFSET = "lavad.source.offset"

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
