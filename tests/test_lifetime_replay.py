"""Lifetime-aware policies replayed on the bundled real Azure slice: repredictions as decisions."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import orjson
import pytest
from support import PROJECT_ROOT, replay_trace
from typer.testing import CliRunner

from lavad.core.engine import Engine
from lavad.core.placement import kernels, lifetime_scan
from lavad.core.placement.kernels import Direct
from lavad.core.placement.lifetime_scan import ScanDirect
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.cli import app
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord
from lavad.streams.oracle import exit_times
from lavad.streams.schema import VmRequest

AZURE_SLICE = PROJECT_ROOT / "data" / "azure-v1-vms-slice"
CONFIG = PROJECT_ROOT / "config" / "lavad.toml"


@functools.cache
def _replayed(policy: str) -> bytes:
    """One replay per policy for the whole module (each takes seconds)."""
    raw, _ = replay_trace(AZURE_SLICE, policy, seed=1)
    return raw


def _decisions(policy: str) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in _replayed(policy).splitlines()]


@pytest.mark.parametrize("policy", ["las", "lava"])
def test_replay_with_repredictions_is_deterministic_and_ordered(policy: str) -> None:
    first = _replayed(policy)
    second, _ = replay_trace(AZURE_SLICE, policy, seed=1)
    assert first == second
    decisions = [orjson.loads(line) for line in first.splitlines()]
    # Decisions come out in event time: a timer fires before the event that
    # passes its due time, so the output never goes back in time.
    times = [float(d["time"]) for d in decisions]  # type: ignore[arg-type]
    assert times == sorted(times)
    requests = sum(1 for e in open_trace(AZURE_SLICE, seed=1).events() if isinstance(e, VmRequest))
    assert sum(1 for d in decisions if d["kind"] == "placement") == requests


def test_las_repredicts_vms_that_outlive_their_prediction() -> None:
    vm_updates = [d for d in _decisions("las") if d["kind"] == "reprediction"]
    assert vm_updates and all(d["subject"] == "vm" for d in vm_updates)
    for decision in vm_updates:
        explanation = decision["explanation"]
        assert isinstance(explanation, dict)
        # A VM is repredicted when it reaches its predicted exit, so its new
        # exit is later than the old one, and from its uptime at that moment.
        assert explanation["predicted_exit"] > explanation["previous_exit"]
        assert explanation["uptime_s"] > 0


def test_lava_reports_host_states_and_classes() -> None:
    updates = [d for d in _decisions("lava") if d["kind"] == "reprediction"]
    host_states = {
        d["explanation"]["state"]  # type: ignore[index]
        for d in updates
        if d["subject"] == "host"
    }
    assert {"open", "recycling", "empty"} <= host_states
    assert any(d["subject"] == "vm" for d in updates)


def test_la_binary_never_repredicts() -> None:
    assert all(d["kind"] == "placement" for d in _decisions("la-binary"))


def test_oracle_exit_times_are_the_first_exit_of_each_vm() -> None:
    events = list(open_trace(AZURE_SLICE, seed=0).events())
    exits = exit_times(events)
    requests = {(e.pool, e.vm_id): e.time for e in events if isinstance(e, VmRequest)}
    assert exits and set(exits) <= set(requests)
    assert all(exits[key] >= requests[key] for key in exits)


def test_cli_compare_runs_oracle_variants(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.json"
    result = CliRunner().invoke(
        app,
        [
            "replay",
            str(AZURE_SLICE),
            "--compare",
            "lava,lava-oracle,las-oracle",
            "--config",
            str(CONFIG),
            "--metrics-json",
            str(metrics),
            "--no-progress",
        ],
        env={"COLUMNS": "200", "LAVAD_METRICS__WARMUP_S": "21600"},
    )
    assert result.exit_code == 0, result.output
    runs = orjson.loads(metrics.read_bytes())["runs"]
    assert [run["policy"] for run in runs] == ["lava", "lava-oracle", "las-oracle"]
    # The oracle's placements differ from the model's: it was told other lifetimes.
    assert runs[0]["pools"] != runs[1]["pools"]


def test_live_daemon_refuses_an_oracle_policy() -> None:
    result = CliRunner().invoke(
        app,
        ["run", "--config", str(CONFIG)],
        env={"COLUMNS": "200", "LAVAD_PLACEMENT__POLICY": "lava-oracle"},
    )
    assert result.exit_code == 2
    assert "placement.policy" in result.output and "oracle" in result.output


def test_timers_due_after_the_last_event_still_fire() -> None:
    """Cut the slice where many VMs run: their overdue repredictions fire up to the end."""
    events = [e for e in open_trace(AZURE_SLICE, seed=1).events() if not isinstance(e, BadRecord)]
    cut = events[len(events) // 2].time
    head = [e for e in events if e.time < cut]
    last_event = head[-1].time
    settings = load_settings(CONFIG)
    sink = io.BytesIO()
    replay(
        head,
        settings.engine_config("las", trace_has_hosts=False),
        end_time=cut + 86_400.0,
        decisions_out=sink,
    )
    times = [float(orjson.loads(line)["time"]) for line in sink.getvalue().splitlines()]
    assert any(last_event < t <= cut + 86_400.0 for t in times)
    assert times == sorted(times)


@pytest.mark.parametrize("policy", ["las", "lava"])
def test_an_engine_resolves_its_policys_kernels_before_any_pool_opens(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Engine.warm_up`` builds a throwaway policy: the lifetime scans' entry points
    are resolved (compiled or loaded) at start-up, not when the first pool opens
    mid-stream, and no pool is opened for it."""
    # The dispatchers, as before any warm-up in this process.
    monkeypatch.setattr(ScanDirect, "refreshed", lifetime_scan._refreshed_lifetime_scan)
    monkeypatch.setattr(ScanDirect, "probed", lifetime_scan._probed_lifetime_scan)
    monkeypatch.setattr(Direct, "book_slot", kernels._book_slot)
    engine = Engine(load_settings(CONFIG).engine_config(policy, trace_has_hosts=False))
    engine.warm_up()
    assert ScanDirect.refreshed is not lifetime_scan._refreshed_lifetime_scan
    assert ScanDirect.probed is not lifetime_scan._probed_lifetime_scan
    assert Direct.book_slot is not kernels._book_slot
    assert not engine.pools


def _replay(policy: str, args: dict[str, object]) -> bytes:
    settings = load_settings(CONFIG)
    settings = settings.model_copy(update={"policies": {**settings.policies, policy: args}})
    trace = open_trace(AZURE_SLICE, seed=1)
    sink = io.BytesIO()
    config = settings.engine_config(policy, trace_has_hosts=trace.has_hosts)
    replay(trace.events(), config, end_time=trace.end_time, decisions_out=sink)
    return sink.getvalue()


@pytest.mark.parametrize("policy", ["las", "lava"])
def test_lifetime_policies_forget_by_default_and_a_file_turns_it_off_with_inf(
    policy: str,
) -> None:
    # TOML has no None: `half_life_s = inf` must decide exactly as never forgetting,
    # and the default (72 h) must be in force, or the two would not differ.
    # Equal arguments decide equally (the replay is deterministic), so the
    # default is checked as arguments, not as a second replay.
    assert validate_policy_args(policy, {}) == validate_policy_args(
        policy, {"half_life_s": 259_200.0}
    )
    never = _replay(policy, {"half_life_s": None})
    assert _replay(policy, {"half_life_s": float("inf")}) == never
    assert _replay(policy, {}) != never


@pytest.mark.parametrize("half_life_s", [1.0, 1e300], ids=["vanishing", "endless"])
def test_an_absurd_half_life_still_places_every_request(half_life_s: float) -> None:
    # 1 s (the least the arguments take) weighs an observation of a minute ago
    # at 2^-60, 1e300 s every one at about 1: neither may raise nor put a NaN
    # in a decision.
    decisions = _replay("las", {"half_life_s": half_life_s})
    assert b"NaN" not in decisions
    requested = sum(1 for e in open_trace(AZURE_SLICE, seed=1).events() if isinstance(e, VmRequest))
    placed = [orjson.loads(line) for line in decisions.splitlines()]
    placed = [d for d in placed if d["kind"] == "placement"]
    assert len(placed) == requested and all(d["host_id"] for d in placed)
