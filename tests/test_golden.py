"""Golden replays: the bundled Azure slice must keep deciding exactly as recorded.

A change that alters any placement or metric shows up here. When the change
is intended, regenerate the files and review their diff:

    LAVAD_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden.py
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson
import pytest
from support import replay_trace

ROOT = Path(__file__).resolve().parents[1]
SLICE = ROOT / "data" / "azure-v1-vms-slice"
GOLDEN = Path(__file__).resolve().parent / "golden"
# Metrics compared to the golden value within this relative tolerance: they
# are sums over hundreds of thousands of floats, whose last bits may differ
# between numpy builds; the decisions themselves must match exactly.
TOLERANCE = 1e-9


@pytest.mark.parametrize("policy", ["bestfit", "firstfit"])
def test_azure_slice_matches_golden(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAVAD_METRICS__WARMUP_S", "21600")
    decisions, result = replay_trace(SLICE, policy, 0)
    pool = result.pools["default"]
    observed = {
        "decisions": decisions.count(b"\n"),
        "decisions_sha256": hashlib.sha256(decisions).hexdigest(),
        "metrics": {k: v for k, v in pool.items() if k != "counters"},
    }
    path = GOLDEN / f"azure-slice-{policy}.json"
    if os.environ.get("LAVAD_UPDATE_GOLDEN") == "1":
        path.write_bytes(orjson.dumps(observed, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    expected = orjson.loads(path.read_bytes())
    assert observed["decisions"] == expected["decisions"]
    assert observed["decisions_sha256"] == expected["decisions_sha256"]
    for key, value in expected["metrics"].items():
        if isinstance(value, float):
            assert observed["metrics"][key] == pytest.approx(value, rel=TOLERANCE), key
        else:
            assert observed["metrics"][key] == value, key
