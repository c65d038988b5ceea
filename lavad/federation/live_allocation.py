"""A live global scheduler's allocation time as Prometheus histograms: request record
timestamp to its launch accepted, and its parts as section III of Megha splits them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

ALLOCATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
COMPONENTS = ("queueing", "processing", "communication", "retries")


class AllocationClock:
    """Allocation time of the tasks this scheduler launched (request record timestamp to
    accepted verdict read back), split as section III: queueing (in this scheduler's
    queues), processing (deciding), communication (launch out, the owner, verdict back:
    the owner's validation is inside), retries (attempts refused on a stale view)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Histogram(
            "lavad_federation_allocation_seconds",
            "Request arrival to its launch accepted, at the global scheduler",
            buckets=ALLOCATION_BUCKETS,
            registry=registry,
        )
        self.parts = Histogram(
            "lavad_federation_allocation_component_seconds",
            "Allocation time per component (section III of Megha)",
            ["component"],
            buckets=ALLOCATION_BUCKETS,
            registry=registry,
        )
        self.arrival: dict[int, float] = {}
        self.mark: dict[int, float] = {}
        self.spent: dict[int, list[float]] = {}
        self.retrying: set[int] = set()

    def arrived(self, task: int, at: float) -> None:
        self.arrival[task] = self.mark[task] = at
        self.spent[task] = [0.0, 0.0, 0.0, 0.0]

    def decided(self, task: int, started: float, done: float) -> None:
        spent = self.spent[task]
        spent[3 if task in self.retrying else 0] += max(0.0, started - self.mark[task])
        self.retrying.discard(task)
        spent[1] += done - started
        self.mark[task] = done

    def refused(self, task: int, now: float) -> None:
        self.spent[task][3] += now - self.mark[task]
        self.mark[task] = now
        self.retrying.add(task)

    def forget(self, task: int) -> None:
        """The task ended without a launch accepted here (refused for good, or its queue moved)."""
        self.arrival.pop(task, None)
        self.mark.pop(task, None)
        self.spent.pop(task, None)
        self.retrying.discard(task)

    def accepted(self, task: int, now: float) -> None:
        spent = self.spent.pop(task)
        spent[2] += now - self.mark.pop(task)
        self.total.observe(now - self.arrival.pop(task))
        for name, value in zip(COMPONENTS, spent, strict=True):
            self.parts.labels(component=name).observe(value)
