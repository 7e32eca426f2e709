"""validator.toml: the shipped example holds the defaults, bad keys are refused by name, paths are the file's."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from node.pool_spec import load_pool_spec
from validator.cli import _TUNING, app
from validator.config import ValidatorConfig
from validator.settings import ValidatorSettingsError, read_settings

CONFIGS = Path(__file__).parents[2] / "configs"


def test_the_shipped_example_documents_the_defaults() -> None:
    settings = read_settings(CONFIGS / "validator.toml")
    defaults = ValidatorConfig()
    for name in set(_TUNING) & set(settings):
        assert settings[name] == getattr(defaults, name), name
    assert settings["grace"] == defaults.grace_seconds and settings["poll"] == defaults.poll_seconds
    # what depends on the pool's precision is left to it: a value set here would hold in a bfloat16 pool too
    assert not {"thresholds", "sampling_margin", "logprob_atol", "dtype"} & set(settings)
    text = (CONFIGS / "validator.toml").read_text()
    assert "# sampling_margin = 1e-3" in text and "# logprob_atol = 1e-3" in text
    assert set(_TUNING) <= {f.name for f in fields(ValidatorConfig)}
    assert ValidatorConfig(**{k: settings[k] for k in set(_TUNING) & set(settings)}) == defaults


def test_relative_paths_are_the_files_and_bad_keys_are_named(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text('[validator]\nstate = "state"\ntask = "../t.toml"\npoll = 1\n')
    assert read_settings(path) == {"state": str(tmp_path / "state"), "task": str(tmp_path.parent / "t.toml"), "poll": 1}
    for text, message in [
        ("[validator]\ngrace_seconds = 5\n", "unknown key validator.grace_seconds"),
        ("[validator]\npoll = true\n", "validator.poll must be int or float"),
        ("[validator]\ncheckpoints = [1]\n", "list of URLs"),
        ("[worker]\nstate = 's'\n", "expected \\[validator\\]"),
        ("[validator\n", "not readable TOML"),
    ]:
        path.write_text(text)
        with pytest.raises(ValidatorSettingsError, match=message):
            read_settings(path)


def test_a_bad_config_stops_prime_validate_run_with_one_line_before_any_chain_call(tmp_path: Path) -> None:
    path = tmp_path / "v.toml"
    path.write_text("[validator]\nworkers = 4\n")
    result = CliRunner().invoke(app, ["run", "--pool", "1", "--dev-key", "9", "--config", str(path)])
    assert result.exit_code == 1
    assert "unknown key validator.workers" in result.output and "Traceback" not in result.output


def test_the_shipped_pool_spec_loads_and_names_the_default_task() -> None:
    spec = load_pool_spec(str(CONFIGS / "pool.toml"))
    assert spec.coordinator == "http://127.0.0.1:8600" and spec.checkpoints == ("http://127.0.0.1:8700",)
    assert spec.task_path == (CONFIGS / "tasks" / "default.toml").resolve() and spec.async_level == 2
