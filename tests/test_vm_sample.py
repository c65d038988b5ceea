"""The placement matrix's seeded sample of VMs (``lavad.evaluation.vm_sample``) on OpenB."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavad.evaluation.vm_sample import kept, sample_vms
from lavad.streams.adapters import open_trace
from lavad.streams.schema import VmExit, VmRequest

OPENB_SLICE = Path(__file__).resolve().parents[1] / "data" / "alibaba-openb-slice"


def _events(seed: int) -> list[object]:
    return list(open_trace(OPENB_SLICE, seed=seed, hosts=False).events())


def _requested(items: list[object]) -> set[str]:
    return {item.vm_id for item in items if isinstance(item, VmRequest)}


def test_a_vm_keeps_all_its_events_or_none() -> None:
    events = _events(0)
    sample = list(sample_vms(events, 0, 0.5))
    requested = _requested(sample)
    exited = {item.vm_id for item in sample if isinstance(item, VmExit)}
    all_exited = {item.vm_id for item in events if isinstance(item, VmExit)}
    # Every exit kept belongs to a kept request, and every kept VM that exits keeps its exit.
    assert exited <= requested
    assert requested & all_exited == exited


def test_the_share_kept_is_near_the_share_asked() -> None:
    every = _requested(_events(0))
    for share in (0.5, 0.95):
        kept_ids = _requested(list(sample_vms(_events(0), 0, share)))
        # Binomial spread: over the slice's 2,500 VMs, 4 sd is at most 0.04.
        sd = (share * (1 - share) / len(every)) ** 0.5
        assert abs(len(kept_ids) / len(every) - share) < 4 * sd + 1e-9, share


def test_seeds_keep_different_vms_and_one_seed_the_same_ones() -> None:
    events = _events(0)
    first = _requested(list(sample_vms(events, 0, 0.9)))
    again = _requested(list(sample_vms(events, 0, 0.9)))
    other = _requested(list(sample_vms(events, 1, 0.9)))
    assert first == again
    assert first != other


def test_all_is_the_trace_itself() -> None:
    events = _events(0)
    assert list(sample_vms(events, 3, 1.0)) == events


def test_seed_and_id_cannot_run_together() -> None:
    # Without the separator, seed 1 with id "2x" and seed 12 with id "x" would hash
    # the same bytes; with it they are different draws (over many ids, not all agree).
    ids = [f"vm-{i}" for i in range(200)]
    assert [kept(1, "2" + i, 0.5) for i in ids] != [kept(12, i, 0.5) for i in ids]


def test_any_id_is_sampled_and_the_same_id_twice_alike() -> None:
    # A lone surrogate (which strict UTF-8 refuses), a NUL and a 1 MB id:
    # each gets an answer, the same one for the same seed.
    for vm_id in ("\ud800", "a\0b", "x" * 1_000_000, ""):
        assert kept(5, vm_id, 0.5) == kept(5, vm_id, 0.5)
    assert [kept(0, f"\ud800{i}", 0.5) for i in range(64)] != [True] * 64


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, float("nan")])
def test_a_share_outside_its_range_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="share of VMs kept"):
        list(sample_vms([], 0, share))
