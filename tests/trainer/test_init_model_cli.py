"""`prime-train init-model`, and a `--help` that answers without loading torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from engine.model.loading import model_hash_of, parameter_count
from trainer.cli import app

runner = CliRunner()


def test_init_model_prints_parameter_count_hash_and_path(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    result = runner.invoke(app, ["init-model", "--out", str(out), "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert f"parameters: {parameter_count(out):,}" in result.stdout
    assert f"model hash: 0x{model_hash_of(out).hex()}" in result.stdout
    assert str(out.resolve()) in result.stdout


def test_init_model_json_output_and_seed_decide_the_hash(tmp_path: Path) -> None:
    hashes = []
    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        result = runner.invoke(app, ["init-model", "--out", str(tmp_path / name), "--seed", seed, "--json"])
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert report["path"] == str((tmp_path / name).resolve())
        hashes.append(report["model_hash"])
    assert hashes[0] == hashes[1] != hashes[2]


def test_init_model_refuses_an_existing_model_in_one_line_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    assert runner.invoke(app, ["init-model", "--out", str(out), "--seed", "1"]).exit_code == 0
    first = model_hash_of(out)
    refused = runner.invoke(app, ["init-model", "--out", str(out), "--seed", "2"], env={"PRIME_DEBUG": None})
    assert refused.exit_code == 1
    assert refused.stderr.strip().splitlines() == [
        f"error: refusing to overwrite {out}: it exists and is not empty (pass --overwrite to replace it)"
    ]
    assert model_hash_of(out) == first
    replaced = runner.invoke(app, ["init-model", "--out", str(out), "--seed", "2", "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert model_hash_of(out) != first


def test_negative_seed_is_rejected_by_the_flag(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init-model", "--out", str(tmp_path / "m"), "--seed", "-1"])
    assert result.exit_code == 2
    assert not (tmp_path / "m").exists()


def test_help_does_not_import_torch_or_transformers() -> None:
    code = (
        "import sys\n"
        "from trainer.cli import app\n"
        "try:\n"
        "    app(['--help'], prog_name='prime-train')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'tokenizers', 'safetensors') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "init-model" in result.stdout
    assert "HEAVY []" in result.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "prime-train"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "init-model" in result.stdout
