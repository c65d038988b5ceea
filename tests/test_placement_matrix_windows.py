"""The placement matrix's OpenB windows replay the pod list each names, on the window's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavad.evaluation import placement_matrix as matrix
from lavad.streams.adapters import open_trace
from lavad.streams.adapters.openb import AlibabaOpenb
from lavad.streams.schema import VmRequest


@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("window", "pod_list", "pods"),
    [
        ("openb", "openb_pod_list_default.csv", 8152),
        ("openb-cpu050", "openb_pod_list_cpu050.csv", 7439),
    ],
)
def test_an_openb_window_replays_its_own_pod_list(
    shared_data: Path,
    tmp_path: Path,
    window: str,
    pod_list: str,
    pods: int,
) -> None:
    options = dict(matrix.WINDOWS[window].options)
    trace_path = matrix.trace_path(window, tmp_path, matrix.Sources(shared_data))
    trace = open_trace(trace_path, seed=0, **options)
    assert isinstance(trace, AlibabaOpenb)
    assert trace.pods_file.name == pod_list
    # The pool is the window's host shape, not the trace's node list.
    assert not trace.has_hosts
    requests = sum(isinstance(event, VmRequest) for event in trace.events())
    assert requests == pods
