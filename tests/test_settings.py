"""Configuration: the default file loads; bad keys and values stop start-up with the key."""

from __future__ import annotations

import pickle
import tomllib
from pathlib import Path

import pytest

from lavad.core.input_bounds import InputBounds, PoolNames
from lavad.core.placement.registry import PolicyConfigError, validate_policy_args
from lavad.daemon.config_file import ConfigError
from lavad.daemon.live.connection import client_options
from lavad.daemon.settings import check_live_settings, load_settings

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
        ("[hosts]\ncount = 1000000000\n", "hosts.count", "less than or equal to 100000"),
        ("[hosts]\nmax_hosts = 0\n", "hosts.max_hosts", "greater than or equal to 1"),
        ("[hosts]\nmax_vms = 0\n", "hosts.max_vms", "greater than or equal to 1"),
        ("[hosts]\nmax_vms = 2.5\n", "hosts.max_vms", "valid integer"),
        ("[hosts]\ncount = 10\nmax_hosts = 9\n", "hosts.max_hosts", "below hosts.count (10)"),
        ("[pools]\nmax_refused = 0\n", "pools.max_refused", "greater than or equal to 1"),
        ("[live]\nkeep_samples_s = inf\n", "live.keep_samples_s", "finite number"),
        ("[live]\nkeep_samples_s = 0\n", "live.keep_samples_s", "greater than 0"),
        ('[hosts]\nsource = "cloud"\n', "hosts.source", "'auto', 'trace' or 'shape'"),
        (
            "[metrics]\nsample_interval_s = 0\n",
            "metrics.sample_interval_s",
            "greater than or equal to 1",
        ),
        # A denormal once passed the check and overflowed the count of ticks over a gap.
        ("[metrics]\nsample_interval_s = 5e-324\n", "metrics.sample_interval_s", "equal to 1"),
        ('[placement]\npolicy = "worstfit"\n', "placement.policy", "unknown policy 'worstfit'"),
        ("[policies.bestfit]\nweights = { cpu = 1.0 }\n", "policies.bestfit.weights.cpu", "cores"),
        ("[policies.bestfit]\nweights = { cores = -1.0 }\n", "policies.bestfit", ">= 0"),
        ('[policies.bestfit]\ntie_break = "coin"\n', "policies.bestfit.tie_break", "random"),
        ("[policies.firstfit]\nfoo = 1\n", "policies.firstfit.foo", "Extra inputs"),
        ("[policies.nosuch]\n", "policies.nosuch", "unknown policy"),
        ('[migrations]\norder = "fifo"\n', "migrations.order", "'lars', 'arrival'"),
        ("[migrations]\nmax_concurrent = 0\n", "migrations.max_concurrent", "greater than"),
        # Periodic looks under a minute: one below the spacing of floats at the
        # event times scheduled the next look at the same time, and the engine hung.
        ("[migrations]\nretry_s = 1e-12\n", "migrations.retry_s", "greater than or equal to 60"),
        (
            "[migrations.rolling]\nbatch = 1\nevery_s = 1e-12\n",
            "migrations.rolling.every_s",
            "greater than or equal to 60",
        ),
        (
            "[policies.las]\nrefit_interval_s = 1e-12\n",
            "policies.las.refit_interval_s",
            "greater than or equal to 60",
        ),
        # A denormal half-life made the decay rate infinite and the counts NaN.
        ("[policies.las]\nhalf_life_s = 5e-324\n", "policies.las.half_life_s", "equal to 1"),
        # Fewer groups than levels would leave a level no row of its own.
        ("[policies.lava]\nmax_groups = 4\n", "policies.lava.max_groups", "equal to 5"),
        # 10^12 groups would be 2 PB of tables.
        ("[policies.las]\nmax_groups = 1e12\n", "policies.las.max_groups", "equal to 10000000"),
        ("[policies.las]\nmax_groups = 2.5\n", "policies.las.max_groups", "valid integer"),
        ("[policies.gpa]\nhalf_life_s = 0.5\n", "policies.gpa.half_life_s", "equal to 1"),
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


def test_a_configuration_error_crosses_a_process_boundary_whole(tmp_path: Path) -> None:
    """The placement matrix runs its cells in worker processes: an error there is
    pickled back, and must arrive with its key and reason, not break the pool."""
    path = tmp_path / "bad.toml"
    path.write_text("[hosts]\ncores = -1\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(copy, ConfigError)
    assert (copy.key, copy.reason, str(copy)) == (
        caught.value.key,
        caught.value.reason,
        str(caught.value),
    )
    # And a policy's refused argument, raised by the registry in a worker.
    with pytest.raises(PolicyConfigError) as refused:
        validate_policy_args("lava", {"waste_tolerance": -1.0})
    again = pickle.loads(pickle.dumps(refused.value))
    assert isinstance(again, PolicyConfigError)
    assert (again.key, again.reason) == (refused.value.key, refused.value.reason)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "absent.toml")


def test_bad_environment_value_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAVAD_HOSTS__MEMORY_GIB", "lots")
    with pytest.raises(ConfigError) as caught:
        load_settings(DEFAULT)
    assert caught.value.key == "hosts.memory_gib"


# (variable, the name suggested). Each was silently dropped (or, nested,
# refused under another name), and the daemon ran on the default it meant to
# replace.
UNKNOWN_VARIABLES = [
    ("LAVAD_HOSTZ__CORES", "LAVAD_HOSTS__CORES"),
    ("LAVAD_KAFKA_BOOTSTRAP_SERVERS", "LAVAD_KAFKA__BOOTSTRAP_SERVERS"),
    ("LAVAD_KAFKA__BOOTSTRAP_SERVER", "LAVAD_KAFKA__BOOTSTRAP_SERVERS"),
    ("LAVAD_PLACEMENT__POLICY__NAME", "LAVAD_PLACEMENT__POLICY"),
    ("LAVAD_MIGRATIONS__DEFRAG__EMPTY", "LAVAD_MIGRATIONS__DEFRAG__EMPTY_BELOW"),
    ("lavad_metrics__warmup", "LAVAD_METRICS__WARMUP_S"),
    ("LAVAD_INPUTS__MAX_TIME", "LAVAD_INPUT__MAX_TIME"),
    ("LAVAD_KAFKA__SASL_PLAIN_PASSWROD", "LAVAD_KAFKA__SASL_PLAIN_PASSWORD"),
    ("LAVAD_", None),
]


@pytest.mark.parametrize(("variable", "suggestion"), UNKNOWN_VARIABLES)
def test_an_unknown_environment_variable_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, variable: str, suggestion: str | None
) -> None:
    monkeypatch.setenv(variable, "hunter2-secret")
    with pytest.raises(ConfigError) as caught:
        load_settings(DEFAULT)
    assert caught.value.key == variable
    assert "unknown environment variable" in caught.value.reason
    if suggestion is not None:
        assert f"did you mean {suggestion}?" in caught.value.reason
    # The value may be a misspelt secret: it is never shown.
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "value", "check"),
    [
        ("LAVAD_POLICIES__BESTFIT__TIE_BREAK", "first", "policies"),
        ("LAVAD_MIGRATIONS__DEFRAG__EMPTY_BELOW", "0.1", "defrag"),
        ("LAVAD_POOLS__ALLOW", '["prod-*", "canary"]', "pools"),
        ("LAVAD_INPUT__MAX_AHEAD_S", "0", "input"),
    ],
)
def test_known_environment_variables_still_apply(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, check: str
) -> None:
    # Below a free-form table (policy arguments) any key passes the variable
    # check; the policy registry checks it.
    monkeypatch.setenv(variable, value)
    settings = load_settings(DEFAULT)
    if check == "policies":
        assert settings.policies["bestfit"]["tie_break"] == "first"
    elif check == "defrag":
        assert settings.migrations.defrag.empty_below == 0.1
    elif check == "pools":
        assert settings.pools == PoolNames(allow=("prod-*", "canary"), max_pools=10_000)
    elif check == "input":
        assert settings.input.max_ahead_s == 0.0


def test_input_bounds_and_pool_names_default_as_documented() -> None:
    settings = load_settings(DEFAULT)
    assert settings.input == InputBounds(4_102_444_800.0, 2_592_000.0, 3_600.0)
    assert settings.pools == PoolNames(("*",), 10_000)
    # The file states the defaults the code has.
    assert settings.input == InputBounds()
    assert settings.pools == PoolNames()


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("[input]\nmax_time = 0\n", "input.max_time", "greater than 0"),
        ("[input]\nmax_time = inf\n", "input.max_time", "finite number"),
        ("[input]\nmax_ahead_s = -1\n", "input.max_ahead_s", "greater than or equal to 0"),
        ("[input]\nmax_behind_s = -1\n", "input.max_behind_s", "greater than or equal to 0"),
        ("[input]\nmax_behind = 1\n", "input.max_behind", "Extra inputs"),
        ("[pools]\nallow = []\n", "pools.allow", "at least 1 item"),
        ('[pools]\nallow = ["prod-*", ""]\n', "pools.allow.1", "at least 1 character"),
        (f'[pools]\nallow = ["{"p" * 257}"]\n', "pools.allow.0", "at most 256 characters"),
        ('[pools]\nallow = "prod-*"\n', "pools.allow", "valid tuple"),
        ("[pools]\nmax_pools = 0\n", "pools.max_pools", "greater than or equal to 1"),
        # An infinite host made Best Fit's score of it NaN (inf free times a
        # zero inverse): every VM then opened a host of its own.
        ("[hosts]\nmemory_gib = inf\n", "hosts.memory_gib", "finite number"),
        ("[hosts]\ngpus = 1e-320\n", "hosts.gpus", "must be 0 or within [1e-09, 1e+09]"),
        ("[hosts]\ncores = 2e9\n", "hosts.cores", "must be 0 or within [1e-09, 1e+09]"),
        # Every section refuses what TOML spells inf and nan, not only the
        # keys that said so one by one.
        ("[admission]\nrefresh_s = nan\n", "admission.refresh_s", "finite number"),
        ("[live]\nretry_max_s = inf\n", "live.retry_max_s", "finite number"),
        ("[policies.las]\ncost_tolerance = inf\n", "policies.las.cost_tolerance", "finite"),
        (
            "[policies.las]\nhalf_life_s = nan\n",
            "policies.las.half_life_s",
            "greater than or equal to 1",
        ),
        # The usage moments take no infinite half-life: refused here, not when built.
        ("[policies.gpa]\nhalf_life_s = inf\n", "policies.gpa.half_life_s", "finite number"),
    ],
)
def test_bad_input_and_pool_settings_name_the_key(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert caught.value.key == key
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        ("LAVAD_PLACEMENT__POLICY", "las-oracle", "placement.policy"),
        ("LAVAD_PLACEMENT__POLICY", "lava-oracle", "placement.policy"),
        ("LAVAD_MIGRATIONS__LIFETIMES", "oracle", "migrations.lifetimes"),
    ],
)
def test_the_live_check_refuses_the_oracles(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, key: str
) -> None:
    check_live_settings(load_settings(DEFAULT))
    monkeypatch.setenv(variable, value)
    settings = load_settings(DEFAULT)  # a replay runs them
    with pytest.raises(ConfigError) as caught:
        check_live_settings(settings)
    assert caught.value.key == key


SECRET = "s3cr3t-Pa55word"


def _sasl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAVAD_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("LAVAD_KAFKA__SASL_PLAIN_USERNAME", "lavad")


def test_a_secret_is_masked_everywhere_but_in_the_client_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _sasl(monkeypatch)
    monkeypatch.setenv("LAVAD_KAFKA__SASL_PLAIN_PASSWORD", SECRET)
    settings = load_settings(DEFAULT)
    for shown in (
        settings.model_dump_json(),
        str(settings.model_dump()),
        repr(settings),
        str(settings.kafka),
    ):
        assert SECRET not in shown
        assert "**********" in shown
    options = client_options(settings.kafka)
    assert options["sasl_plain_password"] == SECRET
    assert type(options["sasl_plain_password"]) is str


@pytest.mark.parametrize("ending", ["", "\n", "\r\n"])
def test_a_secret_is_read_from_its_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ending: str
) -> None:
    _sasl(monkeypatch)
    secret_file = tmp_path / "kafka-password"
    secret_file.write_text(SECRET + ending)
    monkeypatch.setenv("LAVAD_KAFKA__SASL_PLAIN_PASSWORD_FILE", str(secret_file))
    settings = load_settings(DEFAULT)
    assert client_options(settings.kafka)["sasl_plain_password"] == SECRET
    assert SECRET not in settings.model_dump_json()


def test_the_ssl_key_password_is_read_from_its_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "key-password"
    secret_file.write_text(SECRET + "\n")
    config = tmp_path / "lavad.toml"
    config.write_text(f'[kafka]\nssl_password_file = "{secret_file}"\n')
    kafka = load_settings(config).kafka
    assert kafka.ssl_password is not None
    assert kafka.ssl_password.get_secret_value() == SECRET
    assert SECRET not in kafka.model_dump_json()


@pytest.mark.parametrize(
    ("case", "key", "reason"),
    [
        ("missing", "kafka.sasl_plain_password_file", "cannot read"),
        ("directory", "kafka.sasl_plain_password_file", "cannot read"),
        ("empty", "kafka.sasl_plain_password_file", "is empty"),
        ("binary", "kafka.sasl_plain_password_file", "not UTF-8"),
        ("both", "kafka.sasl_plain_password_file", "not both"),
    ],
)
def test_a_bad_secret_file_names_its_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str, key: str, reason: str
) -> None:
    _sasl(monkeypatch)
    secret_file = tmp_path / "kafka-password"
    if case == "directory":
        secret_file.mkdir()
    elif case == "empty":
        secret_file.write_text("\n")
    elif case == "binary":
        secret_file.write_bytes(b"\xff\xfe" + SECRET.encode())
    elif case == "both":
        secret_file.write_text(SECRET)
        monkeypatch.setenv("LAVAD_KAFKA__SASL_PLAIN_PASSWORD", SECRET)
    monkeypatch.setenv("LAVAD_KAFKA__SASL_PLAIN_PASSWORD_FILE", str(secret_file))
    with pytest.raises(ConfigError) as caught:
        load_settings(DEFAULT)
    assert caught.value.key == key
    assert reason in caught.value.reason
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (f"[kafka]\nsasl_plain_pasword = {SECRET!r}\n", "kafka.sasl_plain_pasword"),
        (f"[kafka]\nsasl_plain_password = [{SECRET!r}]\n", "kafka.sasl_plain_password"),
        (f"[kafka]\nssl_password = {{ value = {SECRET!r} }}\n", "kafka.ssl_password"),
    ],
)
def test_a_refused_file_never_shows_a_secret(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert caught.value.key.startswith(key)
    assert SECRET not in str(caught.value)


def test_the_shipped_config_sets_each_policy_argument_to_its_default() -> None:
    """A default chosen on the placement matrix is what `make run` and a copy of
    config/lavad.toml place by: every policy argument the file spells out is that
    policy's registry default. Best Fit's weights are spelled out for the reader as
    1.0 each, which is what its empty default means."""
    shipped = tomllib.loads(DEFAULT.read_text())["policies"]
    for name, raw in shipped.items():
        spelled = validate_policy_args(name, raw)
        default = validate_policy_args(name, {})
        for key in raw:
            if (name, key) == ("bestfit", "weights"):
                assert set(spelled.weights.values()) == {1.0}, "policies.bestfit.weights"
                continue
            assert getattr(spelled, key) == getattr(default, key), f"policies.{name}.{key}"
