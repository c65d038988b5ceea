"""The federation's state topic: owners publish their pools' summaries to it (keyed by
pool, compacted: the newest summary of each pool is what stays; ``live_owner.py``
writes them), and a global scheduler builds its eventually consistent view by
reading it.

A record that is not a usable summary, or a summary that does not come from the
pool's registered owner, is refused with the reason (kept in ``refused``) and the
reading goes on: one bad record never stops a scheduler's view.
"""

from __future__ import annotations

import contextlib
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from lavad.daemon.kafka_settings import KafkaSettings
from lavad.daemon.live.connection import client_options
from lavad.federation.live_clients import topic_partitions
from lavad.federation.summary_codec import SummaryError, decode_summary
from lavad.federation.view import GlobalView

MAX_REFUSALS_KEPT = 1000


def pool_key(pool: int) -> bytes:
    return f"pool-{pool:05d}".encode()


async def ensure_state_topic(kafka: KafkaSettings, topic: str, partitions: int) -> None:
    """Create the state topic (compacted) unless it exists."""
    admin = AIOKafkaAdminClient(**client_options(kafka))
    await admin.start()
    try:
        if topic not in set(await admin.list_topics()):
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [NewTopic(topic, partitions, 1, topic_configs={"cleanup.policy": "compact"})]
                )
    finally:
        await admin.close()


class StateTopicReader:
    """A global scheduler's side: the state topic read into ``view``."""

    def __init__(self, kafka: KafkaSettings, topic: str, view: GlobalView) -> None:
        self.topic = topic
        self.view = view
        self.applied = 0
        self.refused: list[str] = []
        self._consumer = AIOKafkaConsumer(
            enable_auto_commit=False, auto_offset_reset="earliest", **client_options(kafka)
        )
        self._partitions: list[TopicPartition] = []

    async def start(self) -> None:
        await self._consumer.start()
        self._partitions = await topic_partitions(self._consumer, self.topic)
        self._consumer.assign(self._partitions)
        await self._consumer.seek_to_beginning(*self._partitions)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def catch_up(self) -> int:
        """Apply every record up to the topic's end as of the call; the records read."""
        ends = await self._consumer.end_offsets(self._partitions)
        read = 0
        while await self._behind(ends):
            batch = await self._consumer.getmany(*self._partitions, timeout_ms=500)
            for records in batch.values():
                for record in records:
                    read += 1
                    self._take(record)
        return read

    async def _behind(self, ends: dict[TopicPartition, int]) -> bool:
        for tp in self._partitions:
            if await self._consumer.position(tp) < ends[tp]:
                return True
        return False

    def _take(self, record: Any) -> None:
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        topology = self.view.topology
        if record.value is None:
            return  # a deleted pool: nothing to apply
        key = record.key or b""
        pool = self._pool_of(key)
        if pool is None:
            self._refuse(f"{where}: key {key[:40]!r} names no pool of the federation")
            return
        try:
            summary = decode_summary(
                record.value,
                hosts=topology.pools[pool].hosts,
                resources=len(topology.resources),
                tenants=self.view.usage.shape[1],
                schedulers=topology.schedulers,
            )
        except SummaryError as exc:
            self._refuse(f"{where}: {exc}")
            return
        if summary.pool != pool:
            self._refuse(f"{where}: summary of pool {summary.pool} under the key of pool {pool}")
            return
        reason = self.view.apply(summary)
        if reason is None:
            self.applied += 1
        elif reason != "older":
            self._refuse(f"{where}: {reason}")

    def _pool_of(self, key: bytes) -> int | None:
        text = key.decode("ascii", errors="replace")
        # At most 18 digits: int() refuses more than 4,300, and no topology
        # has 10**18 pools.
        number = text[5:]
        if not text.startswith("pool-") or not number.isdigit() or len(number) > 18:
            return None
        pool = int(number)
        return pool if 0 <= pool < len(self.view.topology.pools) else None

    def _refuse(self, reason: str) -> None:
        self.refused.append(reason)
        if len(self.refused) > MAX_REFUSALS_KEPT:
            del self.refused[: MAX_REFUSALS_KEPT // 2]
