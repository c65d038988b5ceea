"""Fetched records as aiokafka parsed them, without a ``ConsumerRecord`` built for each.

aiokafka parses a fetched record batch in its C extension into
``DefaultRecord`` objects, then builds a Python ``ConsumerRecord`` dataclass
from each one (about 1.2 us a record, an eighth of what the engine spends on
an event). The daemon reads only a record's offset, timestamp, key and value,
which the parsed record already carries. ``read_parsed_records`` makes the
consumer hand those over as they are: its fetch buffer stamps every newly
fetched ``PartitionRecords`` so that its record factory returns the parsed
record unchanged. Everything else stays aiokafka's: the CRC checks, skipping
control and aborted batches under read_committed, positions, ``max_records``
and what a rebalance discards.

This leans on aiokafka internals (``Fetcher._records`` and
``PartitionRecords._consumer_record``), so the version is pinned exactly and
``tests/test_live_parsed_records.py`` checks against a real broker that the
records come through parsed. Should the internals move, the consumer is left
as it is (a warning says so): the records are then ``ConsumerRecord``s,
which carry the same four fields, so the daemon stays correct, only slower.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

import aiokafka
import structlog
from aiokafka.consumer.fetcher import FetchResult, PartitionRecords

log = structlog.get_logger("lavad.live")

# The aiokafka release whose internals this module was written against.
AIOKAFKA_VERSION = "0.14.0"


class FetchedRecord(Protocol):
    """What the daemon reads of an input record (a ``DefaultRecord`` or a ``ConsumerRecord``)."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


def _as_parsed(tp: Any, record: Any) -> Any:
    """``PartitionRecords._consumer_record`` for one buffer: the parsed record as it is."""
    return record


class _ParsedRecordsBuffer(OrderedDict[Any, Any]):
    """The fetcher's buffer of fetched partitions; stamps each fetch as it is stored.

    The fetcher stores a fetch with ``buffer[tp] = FetchResult(...)`` before
    anyone reads from it, and reads records lazily, so the stamp is in place
    before the first record is made.
    """

    def __setitem__(self, tp: Any, result: Any) -> None:
        if type(result) is FetchResult:
            records = result._partition_records
            if records is not None:
                records._consumer_record = _as_parsed
        super().__setitem__(tp, result)


def read_parsed_records(consumer: aiokafka.AIOKafkaConsumer) -> bool:
    """Make a started consumer return parsed records; False (and a warning) if it cannot.

    Call it after ``start()`` (which creates the fetcher) and before
    ``subscribe``/``assign``, while nothing has been fetched.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    buffer = getattr(fetcher, "_records", None)
    reason = None
    if aiokafka.__version__ != AIOKAFKA_VERSION:
        reason = f"aiokafka {aiokafka.__version__}, written against {AIOKAFKA_VERSION}"
    elif type(buffer) is not OrderedDict:
        reason = f"the fetcher's buffer is {type(buffer).__name__}, not an OrderedDict"
    elif buffer:
        reason = "records were fetched already"
    elif not callable(getattr(PartitionRecords, "_consumer_record", None)):
        reason = "PartitionRecords has no _consumer_record"
    if reason is not None:
        log.warning("reading aiokafka's ConsumerRecords (slower)", reason=reason)
        return False
    fetcher._records = _ParsedRecordsBuffer()  # type: ignore[union-attr]
    return True
