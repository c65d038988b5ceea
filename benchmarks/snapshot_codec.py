"""What snapshots cost as data (daemon/live/state_codec.py) next to the pickles they replaced.

The state is the engine's pools after the whole bundled Azure slice (one pool,
default configuration: limits on, migrations planner present), under Best Fit
and under LAVA (whose life tables and trackers are the larger state). Times are
the best of several runs, in one process, the codec's type registry already
built (a daemon builds it once).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from lavad.core.engine import Engine
from lavad.daemon.live.state_codec import default_registry, dumps, loads
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.codec import BadRecord

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 5


def _best(run: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
    return best


def _state(path: Path, policy: str) -> tuple[dict[str, Any], int]:
    settings = load_settings(ROOT / "config" / "lavad.toml")
    engine = Engine(settings.engine_config(policy, trace_has_hosts=False))
    events = 0
    for item in open_trace(path, seed=0).events():
        if isinstance(item, BadRecord):
            continue
        engine.handle(item, item.time)
        events += 1
    return dict(engine.pools), events


def snapshot_codec(path: Path) -> None:
    default_registry()
    print(f"snapshot save/load of the engine state after {path.name} (best of {REPEATS})")
    print(f"  {'policy':<9}{'format':<8}{'bytes':>12}{'save ms':>10}{'load ms':>10}")
    for policy in ("bestfit", "lava"):
        pools, events = _state(path, policy)
        data = dumps(pools)
        pickled = pickle.dumps(pools, protocol=pickle.HIGHEST_PROTOCOL)
        rows = [
            ("codec", len(data), _best(partial(dumps, pools)), _best(partial(loads, data))),
            (
                "pickle",
                len(pickled),
                _best(partial(pickle.dumps, pools, protocol=pickle.HIGHEST_PROTOCOL)),
                # Only ever our own bytes, made a line above: the comparison, not a load path.
                _best(partial(pickle.loads, pickled)),
            ),
        ]
        for name, size, save, load in rows:
            print(f"  {policy:<9}{name:<8}{size:>12,}{save * 1e3:>10.1f}{load * 1e3:>10.1f}")
        codec, old = rows
        print(
            f"  {policy}: {events:,} events; codec/pickle size {codec[1] / old[1]:.2f}x,"
            f" save {codec[2] / old[2]:.1f}x, load {codec[3] / old[3]:.1f}x"
        )
