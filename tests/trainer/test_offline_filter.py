"""The offline filter: the band, per-problem pass rates on the tiny model, the spec it writes, `prime-train filter`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.model.loading import load_model
from engine.model.tiny import init_model
from protocol.tasks import TaskSpecError, load_task_spec, open_source, spec_hash
from protocol.tasks.spec import MathJsonlSourceSpec
from trainer.cli import app
from trainer.offline_filter import (
    OfflineFilterError,
    PassBand,
    measure_pass_rates,
    rate_histogram,
    select_in_band,
    write_filtered_spec,
)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "tasks"
DEFAULT_TASK = CONFIGS / "default.toml"
runner = CliRunner()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("filter") / "tiny", seed=0)


@pytest.mark.parametrize(("low", "high"), [(0.6, 0.4), (-0.1, 0.5), (0.5, 1.1)])
def test_band_needs_ordered_bounds_in_unit_interval(low: float, high: float) -> None:
    with pytest.raises(OfflineFilterError, match="0 <= min <= max <= 1"):
        PassBand(low, high)


def test_band_is_inclusive_and_keeps_rate_order() -> None:
    rates = {"a": 0.0, "b": 0.125, "c": 0.5, "d": 0.875, "e": 1.0, "f": 0.25}
    assert select_in_band(rates, PassBand(0.125, 0.875)) == ["b", "c", "d", "f"]
    assert select_in_band(rates, PassBand(0.0, 0.0)) == ["a"]
    assert select_in_band(rates, PassBand(1.0, 1.0)) == ["e"]


def test_a_band_that_keeps_nothing_is_an_error_saying_what_was_seen() -> None:
    with pytest.raises(OfflineFilterError, match=r"no problem of 2 .* \[0.1, 0.9\] \(rates seen: 0.000 to 1.000\)"):
        select_in_band({"a": 0.0, "b": 1.0}, PassBand(0.1, 0.9))


def test_histogram_counts_problems_per_rate() -> None:
    assert rate_histogram({"a": 0.5, "b": 0.0, "c": 0.5, "d": 1.0}) == [(0.0, 1), (0.5, 2), (1.0, 1)]


def test_random_tiny_model_passes_nothing_and_rates_follow_the_ids(model_dir: Path) -> None:
    spec = load_task_spec(DEFAULT_TASK)
    source = open_source(spec)
    ids = ["basic_arithmetic/9", "basic_arithmetic/2", "basic_arithmetic/5"]
    seen: list[int] = []
    rates = measure_pass_rates(load_model(model_dir), spec, source, ids, samples=2, progress=seen.append)
    assert list(rates) == ids
    assert set(rates.values()) == {0.0}  # a random character-level model never writes <answer>N</answer>
    assert sum(seen) == len(ids) * 2


def test_filtered_spec_loads_lists_the_kept_ids_and_hashes_differently(tmp_path: Path) -> None:
    kept = ["basic_arithmetic/12", "basic_arithmetic/3"]
    out = tmp_path / "default.filtered.toml"
    spec = write_filtered_spec(DEFAULT_TASK, kept, out)
    assert spec == load_task_spec(out)
    assert list(open_source(spec).problem_ids()) == kept
    assert (tmp_path / "default.filtered.problems.txt").read_text(encoding="utf-8") == "\n".join(kept) + "\n"
    assert spec_hash(spec) != spec_hash(load_task_spec(DEFAULT_TASK))
    text = out.read_text(encoding="utf-8")
    assert "# keyword arguments of reasoning_gym.create_dataset" in text  # comments survive
    assert 'problems = "default.filtered.problems.txt"' in text
    again = write_filtered_spec(DEFAULT_TASK, kept, tmp_path / "again" / "other.toml")
    assert spec_hash(again) == spec_hash(spec)  # the hash does not depend on where or under what name


def test_filtering_a_filtered_spec_replaces_its_list(tmp_path: Path) -> None:
    first = write_filtered_spec(DEFAULT_TASK, ["basic_arithmetic/1", "basic_arithmetic/2"], tmp_path / "a.toml")
    second = write_filtered_spec(first.path, ["basic_arithmetic/2"], tmp_path / "b.toml")
    assert list(open_source(second).problem_ids()) == ["basic_arithmetic/2"]
    assert (tmp_path / "b.toml").read_text(encoding="utf-8").count("problems =") == 1


def test_a_jsonl_spec_written_elsewhere_still_finds_its_rows(tmp_path: Path) -> None:
    for name in ("math-sample.toml", "math-sample.jsonl"):
        shutil.copy(CONFIGS / name, tmp_path / name)
    spec = write_filtered_spec(tmp_path / "math-sample.toml", ["sub-1", "add-1"], tmp_path / "a" / "b" / "math.toml")
    assert list(open_source(spec).problem_ids()) == ["sub-1", "add-1"]
    original = load_task_spec(CONFIGS / "math-sample.toml").source
    assert isinstance(spec.source, MathJsonlSourceSpec) and isinstance(original, MathJsonlSourceSpec)
    assert spec.source.path == (tmp_path / "math-sample.jsonl").resolve()
    assert spec.source.content_sha256 == original.content_sha256
    assert 'path = "../../math-sample.jsonl"' in (tmp_path / "a" / "b" / "math.toml").read_text(encoding="utf-8")


def test_refuses_to_overwrite_unless_asked_or_to_replace_its_input(tmp_path: Path) -> None:
    out = tmp_path / "f.toml"
    write_filtered_spec(DEFAULT_TASK, ["basic_arithmetic/1"], out)
    with pytest.raises(OfflineFilterError, match="refusing to overwrite"):
        write_filtered_spec(DEFAULT_TASK, ["basic_arithmetic/2"], out)
    replaced = write_filtered_spec(DEFAULT_TASK, ["basic_arithmetic/2"], out, overwrite=True)
    assert list(open_source(replaced).problem_ids()) == ["basic_arithmetic/2"]
    shutil.copy(DEFAULT_TASK, tmp_path / "task.toml")
    with pytest.raises(OfflineFilterError, match="is the spec being filtered"):
        write_filtered_spec(tmp_path / "task.toml", ["basic_arithmetic/1"], tmp_path / "task.toml", overwrite=True)


def test_bad_ids_or_no_ids_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(OfflineFilterError, match="no problems"):
        write_filtered_spec(DEFAULT_TASK, [], tmp_path / "f.toml")
    with pytest.raises(TaskSpecError, match="no problem 'nope/1'"):
        write_filtered_spec(DEFAULT_TASK, ["nope/1"], tmp_path / "f.toml")
    assert list(tmp_path.iterdir()) == []


def test_a_spec_without_a_source_header_is_refused_not_mangled(tmp_path: Path) -> None:
    inline = (
        'name = "m"\nsource = { type = "math_jsonl", path = "rows.jsonl" }\n'
        '[prompt]\nanswer_format = "<answer>x</answer>"\n[sampling]\nmax_tokens = 8\n'
    )
    (tmp_path / "rows.jsonl").write_text('{"id": "a", "question": "q", "answer": "1"}\n', encoding="utf-8")
    (tmp_path / "inline.toml").write_text(inline, encoding="utf-8")
    with pytest.raises(OfflineFilterError, match=r"needs a plain \[source\] table header"):
        write_filtered_spec(tmp_path / "inline.toml", ["a"], tmp_path / "out.toml")
    assert not (tmp_path / "out.toml").exists()


def test_filter_command_keeps_the_band_and_prints_count_histogram_and_hash(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "filtered.toml"
    args = ["filter", "--model", str(model_dir), "--task", str(DEFAULT_TASK), "--out", str(out)]
    result = runner.invoke(app, [*args, "--samples", "2", "--limit", "4", "--min", "0", "--max", "0.5"])
    assert result.exit_code == 0, result.output
    spec = load_task_spec(out)
    assert list(open_source(spec).problem_ids()) == [f"basic_arithmetic/{i}" for i in range(4)]
    assert "kept 4 of 4 with pass rate in [0, 0.5]" in result.stdout
    assert "pass rate 0.000       4" in result.stdout
    assert f"spec hash: 0x{spec_hash(spec).hex()}" in result.stdout

    again = runner.invoke(app, [*args, "--samples", "2", "--limit", "3", "--max", "0", "--min", "0", "--json"])
    assert again.exit_code == 1  # the first run's output is in the way
    assert "--overwrite" in again.stderr
    again = runner.invoke(
        app, [*args, "--samples", "2", "--limit", "3", "--min", "0", "--max", "0", "--overwrite", "--json"]
    )
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert (report["measured"], report["kept"], report["histogram"]) == (3, 3, {"0": 3})
    assert report["spec_hash"] == "0x" + spec_hash(load_task_spec(out)).hex() != f"0x{spec_hash(spec).hex()}"


def test_filter_command_that_keeps_nothing_fails_in_one_line_and_writes_nothing(
    model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "filtered.toml"
    args = ["filter", "--model", str(model_dir), "--task", str(DEFAULT_TASK), "--out", str(out), "--samples", "1"]
    result = runner.invoke(app, [*args, "--limit", "2"], env={"PRIME_DEBUG": None})
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: no problem of 2 has a pass rate in [0.1, 0.9] (rates seen: 0.000 to 0.000); "
        "widen the band, or measure more problems or samples"
    ]
    assert list(tmp_path.iterdir()) == []
    crossed = runner.invoke(app, [*args, "--min", "0.8", "--max", "0.2"], env={"PRIME_DEBUG": None})
    assert crossed.exit_code == 1
    assert "0 <= min <= max <= 1" in crossed.stderr
    assert runner.invoke(app, [*args, "--max", "1.5"]).exit_code == 2  # typer's own range check


def test_the_whole_band_keeps_every_problem_without_sampling_or_a_model(tmp_path: Path) -> None:
    """[0, 1] holds every pass rate: the command writes the first --limit problems (a task without its held-out
    ones, for `prime-devnet up --band 0 1`) and never loads the model, which need not even exist."""
    out = tmp_path / "all.toml"
    args = ["filter", "--model", str(tmp_path / "absent"), "--task", str(DEFAULT_TASK), "--out", str(out)]
    result = runner.invoke(app, [*args, "--limit", "5", "--min", "0", "--max", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["measured"], report["kept"], report["samples"], report["histogram"]) == (0, 5, 0, {})
    assert list(open_source(load_task_spec(out)).problem_ids()) == [f"basic_arithmetic/{i}" for i in range(5)]
    again = runner.invoke(app, [*args, "--limit", "2", "--min", "0", "--max", "1", "--overwrite"])
    assert again.exit_code == 0, again.output
    assert "kept all 2 problems: the band [0, 1] holds every pass rate, none was measured" in again.stdout
