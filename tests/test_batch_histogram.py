"""The batch histogram exposes exactly what prometheus_client's Histogram would."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from lavad.daemon.live.batch_histogram import BatchHistogram
from lavad.daemon.live.telemetry import LATENCY_BUCKETS


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
