"""The batch histogram exposes exactly what prometheus_client's Histogram would."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from lavad.daemon.live.batch_histogram import BatchHistogram
from lavad.daemon.live.publisher import Outgoing, Publisher
from lavad.daemon.live.retry import Backoff
from lavad.daemon.live.telemetry import LATENCY_BUCKETS, Telemetry


def _exposition(registry: CollectorRegistry) -> list[str]:
    lines = generate_latest(registry).decode().splitlines()
    # The reference Histogram also exports a _created timestamp: not a sample we mimic.
    return [line for line in lines if "_created" not in line]


def test_same_exposition_as_prometheus_histogram() -> None:
    # Bounds themselves (a value equal to a bound counts in it: le is "<="), values
    # between bounds, zero, and values past the last bound.
    values = [0.0, 0.005, 0.0051, 0.05, 0.3, 1.0, 2.5, 99.0, 1e6, *LATENCY_BUCKETS[:3]]
    reference_registry, batch_registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram(
        "lat_seconds", "doc", buckets=LATENCY_BUCKETS, registry=reference_registry
    )
    batch = BatchHistogram("lat_seconds", "doc", LATENCY_BUCKETS, batch_registry)
    for value in values:
        reference.observe(value)
    # In two batches: counts add up across calls.
    batch.observe_many(np.asarray(values[:4]))
    batch.observe_many(np.asarray(values[4:]))
    batch.observe_many(np.asarray([], dtype=np.float64))
    assert _exposition(batch_registry) == _exposition(reference_registry)
    assert batch.count == len(values)


def test_bounds_must_increase() -> None:
    with pytest.raises(ValueError, match="must increase"):
        BatchHistogram("x", "doc", [0.1, 0.05], CollectorRegistry())


def test_absurd_record_timestamps_land_in_the_end_buckets() -> None:
    # A producer sets the input record's timestamp: the int64 extremes, far in the
    # future (a negative latency, counted as 0) and long ago (past every bound).
    telemetry = Telemetry()
    publisher = Publisher(telemetry, lambda: Backoff(0.1, 1.0), "g", lambda: None)
    stamps = [2**63 - 1, -(2**63), 0]
    out = [Outgoing("t", b"k", b"{}", [], stamp, "placement") for stamp in stamps]
    publisher._count_published(out, acked=1_700_000_000.0)
    counts = {
        sample.labels["le"]: sample.value
        for family in telemetry.registry.collect()
        if family.name == "lavad_decision_latency_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket")
    }
    lowest = min(counts, key=float)
    assert counts[lowest] == 1  # the future timestamp: latency clamped to 0
    assert counts["+Inf"] == 3
    # The two past timestamps (1970 and int64's minimum) are above every finite bound.
    finite = [le for le in counts if le != "+Inf"]
    assert max(counts[le] for le in finite) == 1
