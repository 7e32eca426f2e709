"""validator.toml: the shipped example holds the defaults, bad keys and flags are refused by name, paths are the file's,
and the settings' bounds are ValidatorConfig's."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.config import ConfigError, declared
from protocol.pool_spec import load_pool_spec
from validator.cli import DeviceChoice, DtypeChoice, ThresholdPreset, app
from validator.config import PRECISION_NAMES, PRECISIONS, ValidatorConfig, ValidatorConfigError
from validator.settings import DEVICES, DTYPES, THRESHOLD_PRESETS, ValidatorSettings

CONFIGS = Path(__file__).parents[2] / "configs"


def test_the_shipped_example_documents_the_defaults() -> None:
    shipped = ValidatorSettings.load(CONFIGS / "validator.toml")
    assert shipped == ValidatorSettings()
    assert shipped.file["grace"] == ValidatorConfig().grace_seconds and shipped.file["poll"] == 2.0
    # what depends on the pool's precision is left to it: a value set here would hold in a bfloat16 pool too
    assert not {"thresholds", "sampling_margin", "logprob_atol", "dtype"} & set(shipped.file)
    text = (CONFIGS / "validator.toml").read_text()
    assert "# sampling_margin = 1e-3" in text and "# logprob_atol = 1e-3" in text
    assert ValidatorConfig(**ValidatorSettings().config_fields()) == ValidatorConfig()
    assert set(ValidatorSettings().config_fields()) <= {f.name for f in fields(ValidatorConfig)}
    assert tuple(PRECISIONS) == PRECISION_NAMES
    assert all(f"{d.key} =" in text for d in declared(ValidatorSettings)), "every key is shown in the example"


def test_the_bounds_of_each_setting_are_those_of_its_validator_config_field() -> None:
    config_fields = {f.name for f in fields(ValidatorConfig)}
    checked = 0
    for item in declared(ValidatorSettings):
        if item.name not in config_fields or item.kind not in (int, float):
            continue
        s, kind = item.setting, item.kind

        def step(value: float, toward: float, kind: type = kind) -> float:
            return value + (1 if toward > value else -1) if kind is int else math.nextafter(value, toward)

        inside = [b for b in (s.minimum, s.maximum) if b is not None]
        outside = [step(b, -math.inf) for b in (s.minimum,) if b is not None]
        outside += [step(b, math.inf) for b in (s.maximum,) if b is not None]
        if s.above is not None:
            inside, outside = [*inside, step(s.above, math.inf)], [*outside, s.above]
        for value in inside:
            ValidatorConfig(**{item.name: kind(value)})
        for value in outside:
            with pytest.raises(ValidatorConfigError):
                ValidatorConfig(**{item.name: kind(value)})
        checked += 1
    assert checked == 15


def test_the_choices_are_the_flags() -> None:
    assert tuple(p.value for p in ThresholdPreset) == THRESHOLD_PRESETS
    assert tuple(c.value for c in DeviceChoice) == DEVICES and tuple(c.value for c in DtypeChoice) == DTYPES


def test_relative_paths_are_the_files_and_bad_keys_are_named(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text('[validator]\nstate = "state"\ntask = "../t.toml"\npoll = 1\n')
    loaded = ValidatorSettings.load(path)
    assert (loaded.state, loaded.task, loaded.poll_seconds) == (tmp_path / "state", tmp_path.parent / "t.toml", 1.0)
    assert loaded.where("poll_seconds") == f"{path}: validator.poll"
    for text, message in [
        ("[validator]\ngrace_seconds = 5\n", "unknown key validator.grace_seconds"),
        ("[validator]\npoll = true\n", r"validator.poll must be a number in \(0, 3600\], got True"),
        ("[validator]\ngrace = 1e9\n", r"validator.grace must be a number in \(0, 604800\]"),
        ("[validator]\ncheckpoints = [1]\n", "validator.checkpoints must be a list of strings"),
        ('[validator]\nthresholds = "gpu"\n', "validator.thresholds must be one of cpu-fp32, bf16, gpu-bf16"),
        ("[worker]\nstate = 's'\n", "expected \\[validator\\]"),
        ("[validator\n", "not readable TOML"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            ValidatorSettings.load(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "v.toml"], "unknown key validator.workers"),
        (["--grace", "0"], "--grace: must be a number in (0, 604800], got 0.0"),
        (["--metrics-port", "70000"], "--metrics-port: must be an integer in [0, 65535], got 70000"),
    ],
)
def test_a_bad_config_or_flag_stops_prime_validate_run_with_one_line_before_any_chain_call(
    tmp_path: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v.toml").write_text("[validator]\nworkers = 4\n")
    result = CliRunner().invoke(app, ["run", "--pool", "1", "--dev-key", "9", *args])
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output


def test_the_shipped_pool_spec_loads_and_names_the_default_task() -> None:
    spec = load_pool_spec(str(CONFIGS / "pool.toml"))
    assert spec.coordinator == "http://127.0.0.1:8600" and spec.checkpoints == ("http://127.0.0.1:8700",)
    assert spec.task_path == (CONFIGS / "tasks" / "default.toml").resolve() and spec.async_level == 2
