"""Per-pool policies (``[placement.pools]``): a fleet's pools placed by different policies.

Two pools replay the same real slice side by side, one matching a pattern that
gives it Best Fit while the engine's policy is LAS: each pool's decisions must
be, byte for byte, those of a replay of that pool alone under its own policy
(pools share nothing but the engine), and a pool no pattern matches keeps the
engine's policy.
"""

from __future__ import annotations

import heapq
import io
import re
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from lavad.core.engine import PoolPolicy, pool_policy
from lavad.core.placement.registry import validate_policy_args
from lavad.daemon.cli import app
from lavad.daemon.config_file import ConfigError
from lavad.daemon.replay import replay
from lavad.daemon.settings import Settings, check_live_settings, load_settings
from lavad.streams.adapters import open_trace

ROOT = Path(__file__).resolve().parents[1]
AZURE_SLICE = ROOT / "data" / "azure-v1-vms-slice"
CONFIG = ROOT / "config" / "lavad.toml"


def _settings(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "lavad.toml"
    path.write_text(CONFIG.read_text(encoding="utf-8") + text, encoding="utf-8")
    return load_settings(path)


def _decisions(settings: Settings, pools: list[str]) -> dict[str, list[bytes]]:
    """Replay the slice once per name in ``pools``, merged by time, under ``settings``'s
    LAS: each pool's decision lines."""
    traces = [open_trace(AZURE_SLICE, seed=0, pool=name) for name in pools]
    events = heapq.merge(*(t.events() for t in traces), key=lambda event: event.time)
    config = settings.engine_config("las", trace_has_hosts=False)
    sink = io.BytesIO()
    replay(events, config, end_time=max(t.end_time for t in traces), decisions_out=sink)
    by_pool: dict[str, list[bytes]] = {name: [] for name in pools}
    for line in sink.getvalue().splitlines():
        by_pool[orjson.loads(line)["pool"]].append(line)
    return by_pool


def test_each_pool_decides_as_it_would_alone_under_its_own_policy(tmp_path: Path) -> None:
    settings = _settings(tmp_path, '\n[placement.pools]\n"gpu-*" = "bestfit"\n')
    both = _decisions(settings, ["cpu-a", "gpu-a"])
    plain = load_settings(CONFIG)
    alone_cpu = _decisions(plain, ["cpu-a"])["cpu-a"]
    alone_gpu = _decisions(plain, ["gpu-a"])["gpu-a"]
    # the engine's LAS on the pool no pattern matches, the same as alone
    assert both["cpu-a"] == alone_cpu
    assert {orjson.loads(line)["policy"] for line in both["cpu-a"]} == {"las"}
    # Best Fit on the matched pool: the decisions a Best Fit replay of it alone gives
    bestfit = _bestfit_alone("gpu-a")
    assert both["gpu-a"] == bestfit
    assert {orjson.loads(line)["policy"] for line in both["gpu-a"]} == {"bestfit"}
    # and not what LAS would have done there (else the test shows nothing)
    assert both["gpu-a"] != alone_gpu


def _bestfit_alone(pool: str) -> list[bytes]:
    settings = load_settings(CONFIG)
    trace = open_trace(AZURE_SLICE, seed=0, pool=pool)
    sink = io.BytesIO()
    config = settings.engine_config("bestfit", trace_has_hosts=trace.has_hosts)
    replay(trace.events(), config, end_time=trace.end_time, decisions_out=sink)
    return sink.getvalue().splitlines()


def test_the_first_matching_pattern_wins() -> None:
    # "gpu-a100" matches both patterns; the one written first places it.
    firstfit = PoolPolicy("gpu-a*", "firstfit", validate_policy_args("firstfit", {}))
    bestfit = PoolPolicy("gpu-*", "bestfit", validate_policy_args("bestfit", {}))
    config = load_settings(CONFIG).engine_config("las", trace_has_hosts=False)
    ordered = replace(config, pool_policies=(firstfit, bestfit))
    assert pool_policy(ordered, "gpu-a100")[0] == "firstfit"
    assert pool_policy(ordered, "gpu-h100")[0] == "bestfit"
    assert pool_policy(ordered, "cpu-1")[0] == "las"
    # fnmatch is case-sensitive here: pool names are ids, not file names
    assert pool_policy(ordered, "GPU-a100")[0] == "las"


def test_the_pools_policies_are_in_the_engines_fingerprint(tmp_path: Path) -> None:
    plain = load_settings(CONFIG).engine_config("las", trace_has_hosts=False)
    mixed = _settings(tmp_path, '\n[placement.pools]\n"gpu-*" = "bestfit"\n').engine_config(
        "las", trace_has_hosts=False
    )
    # A snapshot taken with other pools' policies resumes a different run: refused.
    assert repr(plain) != repr(mixed)


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ('"gpu-*" = "worstfit"\n', "placement.pools.gpu-*", "unknown policy 'worstfit'"),
        ('"" = "bestfit"\n', "placement.pools", "at least 1 character"),
        (f'"{"g" * 257}" = "bestfit"\n', "placement.pools", "at most 256 characters"),
        ("".join(f'"p{i}" = "bestfit"\n' for i in range(1_001)), "placement.pools", "1000 items"),
    ],
    ids=["unknown", "empty", "long-pattern", "too-many"],
)
def test_a_bad_pool_policy_names_its_key(tmp_path: Path, text: str, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _settings(tmp_path, "\n[placement.pools]\n" + text)
    assert caught.value.key.startswith(key)
    assert reason in str(caught.value)
    # A thousand patterns refused are not echoed back whole: the reason stays readable.
    assert len(caught.value.reason) < 600


def test_a_pools_policy_takes_its_arguments_from_its_table(tmp_path: Path) -> None:
    path = tmp_path / "own.toml"
    path.write_text(
        '[placement.pools]\n"gpu-*" = "bestfit"\n[policies.bestfit]\ntie_break = "first"\n',
        encoding="utf-8",
    )
    settings = load_settings(path)
    (chosen,) = settings.engine_config("las", trace_has_hosts=False).pool_policies
    assert chosen.args == validate_policy_args("bestfit", {"tie_break": "first"})


def test_the_daemon_refuses_an_oracle_or_relief_without_gpa_on_a_pool(tmp_path: Path) -> None:
    oracle = _settings(tmp_path, '\n[placement.pools]\n"gpu-*" = "las-oracle"\n')
    with pytest.raises(ConfigError) as caught:
        check_live_settings(oracle)
    assert caught.value.key == "placement.pools.gpu-*"
    path = tmp_path / "relief.toml"
    path.write_text(
        '[placement]\npolicy = "gpa"\n[placement.pools]\n"gpu-*" = "bestfit"\n'
        "[migrations.relief]\nenabled = true\n",
        encoding="utf-8",
    )
    relief = load_settings(path)
    with pytest.raises(ConfigError, match=re.escape("placement.pools.gpu-* 'bestfit'")):
        check_live_settings(relief)


def test_the_environment_sets_the_pools_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAVAD_PLACEMENT__POOLS", '{"gpu-*": "bestfit"}')
    settings = load_settings(CONFIG)
    assert settings.placement.pools == {"gpu-*": "bestfit"}


def test_a_replay_feeds_true_lifetimes_to_an_oracle_named_for_a_pool(tmp_path: Path) -> None:
    # The slice's one pool is "default": placed by the oracle while `policy` is Best
    # Fit, so only the pool's policy asks for the lifetimes the replay must know.
    config = tmp_path / "lavad.toml"
    config.write_text('[placement.pools]\n"def*" = "las-oracle"\n', encoding="utf-8")
    out = tmp_path / "decisions.jsonl"
    result = CliRunner().invoke(
        app,
        ["replay", str(AZURE_SLICE), "--config", str(config), "--out", str(out), "--no-progress"],
    )
    assert result.exit_code == 0, result.output
    lines = out.read_bytes().splitlines()
    assert lines and {orjson.loads(line)["policy"] for line in lines} == {"las-oracle"}


def test_an_existing_schedulers_stream_places_every_pool_by_its_one_policy(
    tmp_path: Path,
) -> None:
    # `lavad shadow placements` stands for the scheduler lavad is compared with: the
    # pools' policies of lavad's own configuration do not reach it.
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(
        CONFIG.read_text(encoding="utf-8") + '\n[placement.pools]\n"def*" = "bestfit"\n',
        encoding="utf-8",
    )
    streams = []
    for config in (CONFIG, mixed):
        out = tmp_path / f"placed-{config.stem}.jsonl"
        result = CliRunner().invoke(
            app,
            ["shadow", "placements", str(AZURE_SLICE), str(out), "--policy", "firstfit",
             "--config", str(config)],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        streams.append(out.read_bytes())
    assert streams[0] and streams[0] == streams[1]
