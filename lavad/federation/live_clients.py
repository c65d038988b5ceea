"""The Kafka clients the live federation's processes share one configuration of."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

# A crashed member is noticed within 4 s (aiokafka's default is 10 s): the
# failover time is this timeout plus a rebalance, so it is kept short.
SESSION_TIMEOUT_MS = 4000
HEARTBEAT_INTERVAL_MS = 500


def group_consumer(bootstrap: str, group_id: str) -> AIOKafkaConsumer:
    """A member of ``group_id`` that commits by hand and starts a new group from the beginning."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        partition_assignment_strategy=(RangePartitionAssignor,),
    )
