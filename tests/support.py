"""Helpers shared by test modules (imported as ``support``; not a fixture module)."""

from __future__ import annotations

import io
from pathlib import Path

from lavad.daemon.replay import ReplayResult, replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def replay_trace(path: Path, policy: str, seed: int) -> tuple[bytes, ReplayResult]:
    """Replay ``path`` with the default configuration (and LAVAD_* overrides).

    Returns the decisions file's bytes and the replay's result.
    """
    settings = load_settings(PROJECT_ROOT / "config" / "lavad.toml").model_copy(
        update={"seed": seed}
    )
    trace = open_trace(path, seed=seed)
    sink = io.BytesIO()
    result = replay(
        trace.events(),
        settings.engine_config(policy, trace_has_hosts=trace.has_hosts),
        end_time=trace.end_time,
        decisions_out=sink,
    )
    return sink.getvalue(), result
