"""Configuration: the default file loads; bad keys and values stop start-up with the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavad.daemon.settings import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "config" / "lavad.toml"


def test_default_file_loads() -> None:
    settings = load_settings(DEFAULT)
    assert settings.placement.policy == "bestfit"
    config = settings.engine_config(trace_has_hosts=False)
    assert config.pools.grow_on_demand
    assert config.pools.shape is not None
    assert settings.engine_config(trace_has_hosts=True).pools.shape is None
    # Maintenance drains run LARS with the paper's defaults; defragmentation is off.
    migrations = config.migrations
    assert (migrations.order, migrations.max_concurrent, migrations.duration_s) == (
        "lars",
        3,
        1200.0,
    )
    assert migrations.defrag.empty_below == 0.0


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAVAD_PLACEMENT__POLICY", "firstfit")
    monkeypatch.setenv("LAVAD_METRICS__WARMUP_S", "0")
    settings = load_settings(DEFAULT)
    assert settings.placement.policy == "firstfit"
    assert settings.metrics.warmup_s == 0.0


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ('colour = "blue"\n', "colour", "Extra inputs are not permitted"),
        ("[hosts]\ncores = -4\n", "hosts.cores", "greater than 0"),
        ("[hosts]\ncount = 1.5\n", "hosts.count", "valid integer"),
        ('[hosts]\nsource = "cloud"\n', "hosts.source", "'auto', 'trace' or 'shape'"),
        ("[metrics]\nsample_interval_s = 0\n", "metrics.sample_interval_s", "greater than 0"),
        ('[placement]\npolicy = "worstfit"\n', "placement.policy", "unknown policy 'worstfit'"),
        ("[policies.bestfit]\nweights = { cpu = 1.0 }\n", "policies.bestfit.weights.cpu", "cores"),
        ("[policies.bestfit]\nweights = { cores = -1.0 }\n", "policies.bestfit", ">= 0"),
        ('[policies.bestfit]\ntie_break = "coin"\n', "policies.bestfit.tie_break", "random"),
        ("[policies.firstfit]\nfoo = 1\n", "policies.firstfit.foo", "Extra inputs"),
        ("[policies.nosuch]\n", "policies.nosuch", "unknown policy"),
        ('[migrations]\norder = "fifo"\n', "migrations.order", "'lars', 'arrival'"),
        ("[migrations]\nmax_concurrent = 0\n", "migrations.max_concurrent", "greater than"),
        ("[migrations.defrag]\nempty_below = 1.5\n", "migrations.defrag.empty_below", "less"),
        ("[migrations.defrag]\nthreshold = 0.1\n", "migrations.defrag.threshold", "Extra"),
        ("[hosts\n", "", "not valid TOML"),
    ],
)
def test_bad_configuration_names_key_and_reason(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert caught.value.key.startswith(key) if key else str(path) == caught.value.key
    assert reason in str(caught.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "absent.toml")


def test_bad_environment_value_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAVAD_HOSTS__MEMORY_GIB", "lots")
    with pytest.raises(ConfigError) as caught:
        load_settings(DEFAULT)
    assert caught.value.key == "hosts.memory_gib"
