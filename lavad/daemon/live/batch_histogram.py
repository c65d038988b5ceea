"""A Prometheus histogram filled a batch at a time.

``prometheus_client.Histogram.observe`` costs about 2 us per value (a lock and
a bucket search in Python each time); the daemon observes one latency per
decision, tens of thousands a second. Here a whole batch is binned at once by
numpy and added to the counts, and the exposition is the same as a
``Histogram``'s (``_bucket`` with ``le``, ``_count``, ``_sum``), so dashboards
and scrapers see no difference.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString


class BatchHistogram(Collector):
    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError(f"{name}: bucket bounds must increase: {bounds}")
        if bounds and bounds[-1] == float("inf"):
            bounds = bounds[:-1]  # +Inf is always the last bucket
        self.name = name
        self.documentation = documentation
        self._bounds = np.asarray(bounds, dtype=np.float64)
        # counts[i]: values in (bounds[i-1], bounds[i]]; the last one: above every bound.
        self._counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self._sum = 0.0
        registry.register(self)

    def observe_many(self, values: np.ndarray) -> None:
        """Add every value of ``values`` (seconds, or whatever the metric counts)."""
        if values.size == 0:
            return
        # side="left": a value equal to a bound belongs to that bound's bucket (le is <=).
        slots = np.searchsorted(self._bounds, values, side="left")
        self._counts += np.bincount(slots, minlength=self._counts.size)
        self._sum += float(values.sum())

    @property
    def count(self) -> int:
        return int(self._counts.sum())

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative = np.cumsum(self._counts)
        labels = [*(floatToGoString(b) for b in self._bounds), "+Inf"]  # type: ignore[no-untyped-call]
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric(
            [],
            buckets=[(le, float(n)) for le, n in zip(labels, cumulative, strict=True)],
            sum_value=self._sum,
        )
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation)
