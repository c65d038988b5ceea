"""A seed outside 0 .. 2**63 - 1 is refused where it enters, naming the range: a larger
one drove a whole replay and then failed with a traceback when the metrics JSON (and
orjson's 64-bit integers) came to hold it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from lavad.daemon.cli import app
from lavad.daemon.config_file import ConfigError
from lavad.daemon.settings import load_settings
from lavad.streams.adapters import open_trace
from lavad.streams.adapters.base import TraceOptionError
from lavad.streams.seeds import MAX_SEED, seed_refusal

ROOT = Path(__file__).resolve().parents[1]
AZURE = str(ROOT / "data" / "azure-v1-vms-slice")
GOOGLE = str(ROOT / "data" / "google-2011-gcd-slice")
MEGHA = str(ROOT / "data" / "megha-goog-slice")
TOO_LARGE = str(MAX_SEED + 1)


@pytest.mark.parametrize(
    "arguments",
    [
        ["replay", AZURE, "--seed", TOO_LARGE],
        ["trace", "info", AZURE, "--seed", TOO_LARGE],
        ["trace", "convert", AZURE, "{tmp}/out.jsonl", "--seed", TOO_LARGE],
        ["produce", AZURE, "--seed", TOO_LARGE],
        ["evaluate", "lifetime", AZURE, "--seed", TOO_LARGE],
        ["evaluate", "admission", AZURE, "--seed", TOO_LARGE],
        ["evaluate", "limits", GOOGLE, "--seed", TOO_LARGE],
        ["evaluate", "federation", MEGHA, "--seed", TOO_LARGE],
        ["replay", AZURE, "--seed", "-1"],
    ],
    ids=lambda arguments: " ".join(arguments[:2]) + " " + arguments[-1],
)
def test_a_seed_out_of_range_stops_the_command_before_the_work(
    tmp_path: Path, arguments: list[str]
) -> None:
    argv = [argument.replace("{tmp}", str(tmp_path)) for argument in arguments]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    # Rich boxes and wraps the message: compared without the frame and the breaks.
    shown = " ".join(result.output.replace("│", " ").split())
    bound = (
        "less than or equal to 9223372036854775807"
        if arguments[-1] == TOO_LARGE
        else ("greater than or equal to 0")
    )
    assert "Invalid value for '--seed'" in shown and bound in shown, shown
    assert list(tmp_path.iterdir()) == []


def test_a_seeds_list_with_one_out_of_range_is_refused() -> None:
    result = CliRunner().invoke(app, ["evaluate", "limits", GOOGLE, "--seeds", f"0,{TOO_LARGE}"])
    assert result.exit_code == 2, result.output
    assert "--seeds: seed must be an integer from 0 to 2**63 - 1" in " ".join(result.output.split())


def test_the_largest_seed_replays_and_is_written_into_the_metrics(tmp_path: Path) -> None:
    metrics = tmp_path / "m.json"
    result = CliRunner().invoke(
        app, ["replay", AZURE, "--seed", str(MAX_SEED), "--metrics-json", str(metrics)]
    )
    assert result.exit_code == 0, result.output
    assert orjson.loads(metrics.read_bytes())["seed"] == MAX_SEED


@pytest.mark.parametrize("where", ["file", "environment"])
def test_a_configured_seed_out_of_range_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    config = tmp_path / "lavad.toml"
    if where == "file":
        # TOML's integers stop at 2**63 - 1, but Python's reader takes larger ones.
        config.write_text(f"seed = {TOO_LARGE}\n")
    else:
        config.write_text("")
        monkeypatch.setenv("LAVAD_SEED", TOO_LARGE)
    with pytest.raises(ConfigError) as raised:
        load_settings(config)
    assert "seed" in str(raised.value)


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, True, 1.0, "0"])
def test_open_trace_and_the_rule_refuse_what_is_not_a_seed(seed: object) -> None:
    reason = seed_refusal(seed)
    assert reason == f"seed must be an integer from 0 to 2**63 - 1, got {seed!r}"
    with pytest.raises(TraceOptionError, match="2\\*\\*63 - 1"):
        open_trace(AZURE, seed=seed)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, MAX_SEED])
def test_the_rule_takes_every_seed_in_range(seed: int) -> None:
    assert seed_refusal(seed) is None
