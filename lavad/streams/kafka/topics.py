"""Which topic an event or a decision travels on, and creating the topics.

Inputs are keyed by pool and co-partitioned (same partition count), so all of
a pool's events, whatever their topic, land on the same partition number:
that number is what an instance owns and snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code
from pydantic import BaseModel, ConfigDict, Field

from lavad.streams.schema import DecisionKind


class TopicError(Exception):
    """The topics are missing or not laid out as lavad needs."""


class TopicNames(BaseModel):
    """The topics lavad reads and writes, and how ``lavad topics create`` lays them out.

    The ``[topics]`` table of the configuration is this model (one
    definition of the names and their defaults for the settings, the shells
    and the tests). Inputs are co-partitioned: keyed by pool, with one
    partition count.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    vm_events: str = Field(default="lavad.vm-events", min_length=1, max_length=249)
    deployments: str = Field(default="lavad.deployments", min_length=1, max_length=249)
    usage: str = Field(default="lavad.usage", min_length=1, max_length=249)
    placements: str = Field(default="lavad.placements", min_length=1, max_length=249)
    admissions: str = Field(default="lavad.admissions", min_length=1, max_length=249)
    migrations: str = Field(default="lavad.migrations", min_length=1, max_length=249)
    limits: str = Field(default="lavad.limits", min_length=1, max_length=249)
    repredictions: str = Field(default="lavad.repredictions", min_length=1, max_length=249)
    dead_letters: str = Field(default="lavad.dead-letters", min_length=1, max_length=249)
    partitions: int = Field(default=3, ge=1, description="partitions of every topic lavad creates")
    replication_factor: int = Field(
        default=1, ge=1, description="replicas of every topic lavad creates"
    )

    def named(self) -> dict[str, str]:
        """Each topic by its key (``vm_events`` -> ``lavad.vm-events``), in declaration order."""
        return {key: getattr(self, key) for key in TOPIC_KEYS}

    @property
    def inputs(self) -> tuple[str, str, str]:
        return (self.vm_events, self.deployments, self.usage)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (
            self.placements,
            self.admissions,
            self.migrations,
            self.limits,
            self.repredictions,
            self.dead_letters,
        )

    @property
    def all(self) -> tuple[str, ...]:
        return tuple(getattr(self, key) for key in TOPIC_KEYS)

    def for_event_type(self, event_type: str) -> str:
        if event_type.startswith("deployment."):
            return self.deployments
        if event_type == "usage":
            return self.usage
        return self.vm_events

    def for_decision(self, kind: DecisionKind) -> str:
        if kind == "placement":  # the hot case, first
            return self.placements
        if kind == "admission":
            return self.admissions
        if kind == "migration":
            return self.migrations
        if kind in {"limit", "replicas"}:
            # Replica recommendations are the horizontal half of the limits.
            return self.limits
        return self.repredictions


TOPIC_KEYS: Final = (
    "vm_events",
    "deployments",
    "usage",
    "placements",
    "admissions",
    "migrations",
    "limits",
    "repredictions",
    "dead_letters",
)


async def ensure_topics(admin: AIOKafkaAdminClient, names: TopicNames, partitions: int) -> None:
    """Create any missing topic: inputs with ``partitions`` partitions, outputs likewise."""
    existing = set(await admin.list_topics())
    missing = [name for name in names.all if name not in existing]
    if not missing:
        return
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name in missing])
    except TopicAlreadyExistsError:
        return


@dataclass(frozen=True, slots=True)
class TopicsCreated:
    created: tuple[str, ...]
    existing: tuple[str, ...]


async def partition_counts(admin: AIOKafkaAdminClient) -> dict[str, int]:
    """Every topic on the cluster with its partition count."""
    # Metadata for all topics (None): asking for named ones could auto-create
    # them on a broker that allows it, with the broker's partition count.
    return {
        topic["topic"]: len(topic["partitions"])
        for topic in await admin.describe_topics(None)
        if topic["error_code"] == 0
    }


async def create_topics(
    admin: AIOKafkaAdminClient, names: TopicNames, partitions: int, replication_factor: int
) -> TopicsCreated:
    """Create every topic lavad uses; idempotent. A topic laid out otherwise is a TopicError.

    Every topic, outputs included, gets ``partitions``: an input topic with
    another count would move pools between partition numbers (and so between
    snapshots); outputs are keyed by pool the same way.
    """
    counts = await partition_counts(admin)
    _refuse_other_counts(counts, names, partitions)
    missing = [name for name in names.all if name not in counts]
    if missing:
        response = await admin.create_topics(
            [NewTopic(name, partitions, replication_factor) for name in missing]
        )
        for topic, code, *rest in response.topic_errors:
            error = for_code(code)
            if code == 0 or error is TopicAlreadyExistsError:
                continue  # created, or by someone else meanwhile (its count is checked below)
            detail = rest[0] if rest and rest[0] else error.__name__
            raise TopicError(
                f"could not create topic {topic!r} with {partitions} partitions and replication "
                f"factor {replication_factor}: {detail}"
            )
        _refuse_other_counts(await partition_counts(admin), names, partitions)
    return TopicsCreated(
        created=tuple(missing), existing=tuple(n for n in names.all if n not in missing)
    )


def _refuse_other_counts(counts: dict[str, int], names: TopicNames, partitions: int) -> None:
    wrong = {name: counts[name] for name in names.all if counts.get(name, partitions) != partitions}
    if wrong:
        listed = ", ".join(f"{name} has {count}" for name, count in wrong.items())
        raise TopicError(
            f"topics exist with another partition count than topics.partitions = {partitions}: "
            f"{listed}. lavad does not repartition (a pool would move to another partition "
            "and lose its snapshot); set topics.partitions to match, or delete and recreate them"
        )


def check_copartitioned(partition_counts: dict[str, int | None], names: TopicNames) -> int:
    """The common partition count of the input topics, or a TopicError naming the problem."""
    counts: dict[str, int] = {}
    for topic in names.inputs:
        count = partition_counts.get(topic)
        if not count:
            raise TopicError(
                f"input topic {topic!r} does not exist; create the input topics with one "
                "partition count (lavad keys records by pool)"
            )
        counts[topic] = count
    if len(set(counts.values())) != 1:
        listed = ", ".join(f"{topic}={count}" for topic, count in counts.items())
        raise TopicError(
            f"input topics must have the same partition count so a pool's events share a "
            f"partition number: {listed}"
        )
    return next(iter(counts.values()))
