"""Every kernel a pool's life calls is compiled before the first event.

``Engine.warm_up`` builds each configured policy, takes it through one VM's
life (``core/placement/rehearsal.py``) and compiles the stranding sample's
kernel. What it leaves out compiles mid-stream, where a replay counts it in
a policy's time and the live daemon's event loop waits for it. Each check
runs in a fresh interpreter: in the test worker's own, kernels compiled by
earlier tests would pass it whatever the warm-up did.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lavad.core.placement.framework import Policy
from lavad.core.placement.lifetime import LifetimeTracker
from lavad.core.placement.registry import REGISTRY, build_policy, validate_policy_args
from lavad.core.placement.rehearsal import rehearse

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Warm up an engine for the policy, note how many types each of lavad's
# compiled kernels has been compiled for, replay the bundled slice through
# that engine, and print the kernels that were compiled for a new type
# during the replay.
_CHECK = """
import io, json, sys
from pathlib import Path
from numba.core.registry import CPUDispatcher
from lavad.core.engine import Engine
from lavad.daemon.replay import replay
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace


def compiled():
    counts = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("lavad."):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, CPUDispatcher):
                kernel = f"{value.py_func.__module__}.{value.py_func.__qualname__}"
                counts[kernel] = len(value.signatures)
    return counts


settings = load_settings(Path("config/lavad.toml"))
trace = open_trace(Path("data/azure-v1-vms-slice"), seed=0)
config = settings.engine_config(sys.argv[1], trace_has_hosts=trace.has_hosts)
engine = Engine(config)
engine.warm_up()
before = compiled()
result = replay(trace.events(), config, end_time=trace.end_time, engine=engine)
after = compiled()
grown = sorted(k for k, n in after.items() if n > before.get(k, 0))
print(json.dumps({"placements": result.decisions.get("placement", 0), "grown": grown}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["bestfit", "las", "lava", "la-binary"])
def test_a_replay_after_the_warm_up_compiles_no_kernel(policy: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, policy],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # The slice's requests were placed: the replay reached refits and exits.
    assert report["placements"] > 40_000
    assert report["grown"] == []


def _fresh(name: str) -> Policy:
    return build_policy(name, validate_policy_args(name, {}), np.random.default_rng(0))


@pytest.mark.parametrize("name", REGISTRY.names)
def test_each_policy_rehearses_a_whole_life_and_keeps_no_vm_nor_notice(name: str) -> None:
    policy = _fresh(name)
    assert rehearse(policy)  # placed on the empty host: its whole life rehearsed
    # The VM came and went: nothing of it is left for a pool's stream.
    tracker = policy.hooks.lifetime_tracker()
    if isinstance(tracker, LifetimeTracker):
        assert not tracker.is_running("rehearsal-vm")
    assert policy.hooks.take_notices() == []
