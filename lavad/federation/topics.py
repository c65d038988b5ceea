"""The live federation's topics, laid out from its configuration, and their creation.

Partition numbers carry meaning here: launch partition p is pool p (and so is
state partition p), and requests partition t is tenant queue t. A topic that
exists with another count would send a pool's launches or a tenant's requests
to the wrong owner or queue, so creating the topics refuses such a layout
instead of leaving it. The verdicts, dead letters and owner snapshots are one
partition each: the schedulers read every verdict, and snapshots are keyed by pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from lavad.federation.live_wire import (
    DEAD_LETTERS,
    LAUNCHES,
    OWNER_SNAPSHOTS,
    REQUESTS,
    STATE,
    VERDICTS,
)
from lavad.streams.kafka.topics import TopicError, partition_counts

# The state topic keeps each pool's newest summary; the owners' snapshots each
# pool's newest snapshot: compacted on a real cluster.
COMPACTED = {"cleanup.policy": "compact"}


@dataclass(frozen=True, slots=True)
class FederationTopic:
    name: str
    partitions: int
    compacted: bool = False


def federation_topics(pools: int, tenants: int) -> tuple[FederationTopic, ...]:
    """Every topic the owners and schedulers use, with its partition count."""
    return (
        FederationTopic(REQUESTS, tenants),
        FederationTopic(LAUNCHES, pools),
        FederationTopic(VERDICTS, 1),
        FederationTopic(DEAD_LETTERS, 1),
        FederationTopic(STATE, pools, compacted=True),
        FederationTopic(OWNER_SNAPSHOTS, 1, compacted=True),
    )


async def create_federation_topics(
    admin: AIOKafkaAdminClient, topics: tuple[FederationTopic, ...], replication_factor: int
) -> tuple[str, ...]:
    """Create the missing ``topics``; the names created. Idempotent.

    A topic that exists (before, or made by someone else meanwhile) with another
    partition count is a ``TopicError`` naming it.
    """
    counts = await partition_counts(admin)
    _refuse_other_counts(counts, topics)
    missing = [topic for topic in topics if topic.name not in counts]
    if missing:
        response = await admin.create_topics(
            [
                NewTopic(
                    topic.name,
                    topic.partitions,
                    replication_factor,
                    topic_configs=COMPACTED if topic.compacted else {},
                )
                for topic in missing
            ]
        )
        for name, code, *rest in response.topic_errors:
            error = for_code(code)
            if code == 0 or error is TopicAlreadyExistsError:
                continue
            detail = rest[0] if rest and rest[0] else error.__name__
            raise TopicError(f"could not create topic {name!r}: {detail}")
        _refuse_other_counts(await partition_counts(admin), topics)
    return tuple(topic.name for topic in missing)


def _refuse_other_counts(counts: dict[str, int], topics: tuple[FederationTopic, ...]) -> None:
    wrong = [
        f"{topic.name} has {counts[topic.name]} (needs {topic.partitions})"
        for topic in topics
        if counts.get(topic.name, topic.partitions) != topic.partitions
    ]
    if wrong:
        raise TopicError(
            "federation topics exist with other partition counts than federation.pools and "
            f"federation.tenants give: {', '.join(wrong)}"
        )
