"""Admission evaluation pieces on the real alibaba-dlrm trace (../shared/data)."""

from __future__ import annotations

import csv
import math
from itertools import pairwise
from pathlib import Path

import pytest

from lavad.core.admission import ZerothMoment
from lavad.evaluation.admission import (
    choose_capacity,
    fit_samples,
    load_vm_events,
    offered_load,
)
from lavad.evaluation.admission_replay import REQUEST, replay
from lavad.models.deployments.fit import fit_priors


@pytest.mark.shared_data
def test_dlrm_events_priors_and_capacity(shared_data: Path) -> None:
    events = load_vm_events(shared_data / "alibaba-dlrm", "alibaba-dlrm")
    requests = [e for e in events if e.kind == REQUEST]
    with (shared_data / "alibaba-dlrm" / "disaggregated_DLRM_trace.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    instant = sum(
        1 for r in rows if r["creation_time"] and r["creation_time"] == r["deletion_time"]
    )
    assert len(rows) == 23871  # the trace's instance count (its README)
    assert 0 < instant < 100
    assert len(requests) == len(rows) - instant  # zero-lifetime instances are dropped
    assert len({e.deployment for e in requests}) == 156  # apps
    assert all(a.time <= b.time for a, b in pairwise(events))
    first, last = events[0].time, requests[-1].time
    start = first + 0.3 * (last - first)
    priors = fit_priors(fit_samples(events, start, arrived_only=False))
    for belief in (priors.core_death, priors.scale_out, priors.size, priors.kill):
        assert belief.shape > 0 and math.isfinite(belief.rate)
    # instances ask for 2 to 192 cores: the mean scale-out excess lies in between
    assert 1.0 < priors.size.mean < 192.0
    at_start, peak = offered_load(events, start)
    assert 0 < at_start <= peak
    target = 0.01
    capacity = choose_capacity(events, priors, start, last, target, 0.5, iterations=8)
    assert at_start < capacity <= peak
    everyone = replay(events, ZerothMoment(1.0), priors, peak, start=start, end=last)
    assert everyone.failures == 0 and everyone.arrivals > 0
    nobody = replay(events, ZerothMoment(1e-12), priors, capacity, start=start, end=last)
    assert nobody.admitted == 0 and nobody.failure_rate <= target
    squeezed = replay(events, ZerothMoment(1.0), priors, capacity, start=start, end=last)
    # at this capacity admitting everyone breaks the target: admission binds
    assert squeezed.failure_rate > target
