"""Shared setup of the shadow-mode tests: the bundled Azure slice on a fixed pool."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from lavad.core.engine import EngineConfig
from lavad.daemon.settings import Settings, load_settings
from lavad.daemon.shadow.placed import placed_events
from lavad.streams.adapters import open_trace
from lavad.streams.schema import Event

PROJECT_ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = PROJECT_ROOT / "data" / "azure-v1-vms-slice"
# The slice's peak need is ~416 hosts of the default shape: a fixed pool of
# 440, as both sides of a shadow run share their hosts (none grows).
SLICE_HOSTS = 440
# The slice holds 16.7 h of arrivals: a 6 h warm-up, as `make replay` uses.
SLICE_WARMUP_S = 21_600.0

# The metrics both sides are measured by, compared between runs.
METRIC_KEYS = (
    "empty_hosts_pct",
    "hosts_used_mean",
    "cpu_util_pct",
    "memory_util_pct",
    "stranded_cpu_pct",
    "stranded_memory_pct",
    "stranding_samples",
    "hosts_used_peak",
    "hosts_up_end",
    "requests",
    "placed",
    "placement_failures",
    "measured_from_s",
    "measured_until_s",
)


def fixed_pool_settings(hosts: int = SLICE_HOSTS, **shadow: Any) -> Settings:
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml")
    return settings.model_copy(
        update={
            "hosts": settings.hosts.model_copy(
                update={"source": "shape", "count": hosts, "grow_on_demand": False}
            ),
            "metrics": dataclasses.replace(settings.metrics, warmup_s=SLICE_WARMUP_S),
            "shadow": settings.shadow.model_copy(update=shadow),
        }
    )


def engine_config(settings: Settings, policy: str) -> EngineConfig:
    return settings.engine_config(policy, trace_has_hosts=False)


def firstfit_stream(settings: Settings, limit: int | None = None) -> list[Event]:
    """The slice as a First Fit scheduler would publish it (vm.placed events)."""
    events = list(
        placed_events(open_trace(AZURE_SLICE, seed=0).events(), engine_config(settings, "firstfit"))
    )
    return events if limit is None else events[:limit]


def slice_end_time() -> float | None:
    return open_trace(AZURE_SLICE, seed=0).end_time


def metrics(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: summary[key] for key in METRIC_KEYS}
