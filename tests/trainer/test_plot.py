"""Metrics JSONL read back (blank, partial and malformed lines) and drawn to PNG; `prime-train plot`."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from trainer.cli import app
from trainer.errors import TrainerError
from trainer.plot import (
    DPI,
    PANEL_HEIGHT_IN,
    WIDTH_IN,
    MalformedMetricsError,
    NoMetricsError,
    PartialLastLineWarning,
    plot_metrics,
    read_metrics,
)

runner = CliRunner()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def record(step: int, **fields: Any) -> dict[str, Any]:
    """A line as the training loop writes it: pass rate and reward climb with the step."""
    return {"step": step, "reward_mean": 0.1 * step, "pass_rate": step / 20, "seconds": 3.0 * step, **fields}


def run_records(steps: int = 10, *, eval_every: int = 4, optimizer: bool = True) -> list[dict[str, Any]]:
    records = []
    for step in range(1, steps + 1):
        extra: dict[str, Any] = {"tokens_per_s": 900.0, "clipped_fraction": 0.01}
        if optimizer:
            extra |= {"loss": 1.0 / step, "grad_norm": 0.5 + step % 3}
        if step % eval_every == 0:
            extra["eval_pass_rate"] = step / 25
        records.append(record(step, **extra))
    return records


def write_jsonl(path: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which must come first."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plot_writes_a_png_with_two_panels_when_loss_and_grad_norm_are_logged(tmp_path: Path) -> None:
    out = tmp_path / "reward.png"
    summary = plot_metrics(run_records(10), out, title="tiny run")
    assert summary.path == out
    assert (summary.steps, summary.eval_points, summary.panels) == (10, 2, 2)  # evaluations at steps 4 and 8
    assert png_size(out) == (round(WIDTH_IN * DPI), round(2 * PANEL_HEIGHT_IN * DPI))
    pixels = imread(out)
    assert pixels.shape[:2] == (round(2 * PANEL_HEIGHT_IN * DPI), round(WIDTH_IN * DPI))
    assert pixels.std() > 0  # something was drawn, not a blank canvas


def test_plot_has_one_panel_without_loss_or_grad_norm(tmp_path: Path) -> None:
    out = tmp_path / "reward.png"
    summary = plot_metrics(run_records(5, optimizer=False), out)
    assert summary.panels == 1
    assert png_size(out) == (round(WIDTH_IN * DPI), round(PANEL_HEIGHT_IN * DPI))


def test_grad_norm_alone_still_gets_the_optimizer_panel(tmp_path: Path) -> None:
    records = [record(step, grad_norm=1.0 / step) for step in range(1, 4)]
    assert plot_metrics(records, tmp_path / "r.png").panels == 2


def test_eval_markers_are_drawn_only_where_an_evaluation_was_logged(tmp_path: Path) -> None:
    records = run_records(12, eval_every=3)  # steps 3, 6, 9, 12
    records[5]["eval_pass_rate"] = None  # step 6: a writer that logs null for "no evaluation"
    summary = plot_metrics(records, tmp_path / "a.png")
    assert summary.eval_points == 3
    assert plot_metrics(run_records(12, eval_every=100), tmp_path / "b.png").eval_points == 0


def test_summary_reports_first_and_last_pass_rate_in_step_order(tmp_path: Path) -> None:
    records = run_records(6)
    summary = plot_metrics(records[::-1], tmp_path / "r.png")  # file order does not matter
    assert (summary.first_step, summary.last_step) == (1, 6)
    assert (summary.first_pass_rate, summary.last_pass_rate) == (0.05, 0.3)


def test_a_step_logged_twice_keeps_its_later_line(tmp_path: Path) -> None:
    resumed = [*run_records(3), record(2, pass_rate=0.9), record(3, pass_rate=0.95)]
    summary = plot_metrics(resumed, tmp_path / "r.png")
    assert summary.steps == 3
    assert summary.last_pass_rate == 0.95


def test_plot_replaces_an_existing_png_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "plots" / "reward.png"  # the directory is created
    plot_metrics(run_records(3, optimizer=False), out)
    first = out.read_bytes()
    plot_metrics(run_records(3), out)
    assert out.read_bytes() != first
    assert [p.name for p in out.parent.iterdir()] == ["reward.png"]


def test_plot_refuses_no_records(tmp_path: Path) -> None:
    with pytest.raises(NoMetricsError, match="no metrics"):
        plot_metrics([], tmp_path / "r.png")
    assert not (tmp_path / "r.png").exists()


def test_read_skips_blank_lines_and_keeps_unknown_fields_out_of_the_way(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    lines = [json.dumps(record(1, note={"any": "thing"}, tokens_per_s="n/a")), "", "   ", json.dumps(record(2)), ""]
    path.write_text("\n".join(lines))
    records = read_metrics(path)
    assert [r["step"] for r in records] == [1, 2]
    assert plot_metrics(records, tmp_path / "r.png").steps == 2


def test_read_skips_a_partial_last_line_with_a_warning(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", run_records(3), tail='{"step": 4, "reward_me')
    with pytest.warns(PartialLastLineWarning, match=r"m\.jsonl, line 4: skipped a partial last line"):
        records = read_metrics(path)
    assert [r["step"] for r in records] == [1, 2, 3]


def test_read_skips_a_last_line_cut_inside_a_utf8_character(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", run_records(2))
    with path.open("ab") as handle:
        handle.write('{"step": 3, "note": "é'.encode()[:-1])  # half of a two-byte character
    with pytest.warns(PartialLastLineWarning, match="not UTF-8"):
        assert len(read_metrics(path)) == 2


def test_a_malformed_middle_line_is_an_error_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    good = [json.dumps(r) for r in run_records(3)]
    path.write_text("\n".join([good[0], "", '{"step": 2, "reward_me', good[2]]) + "\n")
    with pytest.raises(MalformedMetricsError) as caught:
        read_metrics(path)
    assert (caught.value.path, caught.value.line) == (path, 3)  # blank lines still count
    assert str(caught.value).startswith(f"{path}, line 3: not JSON")
    assert isinstance(caught.value, TrainerError)


@pytest.mark.parametrize(
    ("line", "detail"),
    [
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"reward_mean": 0.5, "pass_rate": 0.5}), "'step' must be a non-negative integer, got None"),
        (json.dumps(record(2) | {"step": "2"}), "'step' must be a non-negative integer, got '2'"),
        (json.dumps(record(2) | {"step": True}), "'step' must be a non-negative integer, got True"),
        (json.dumps({"step": 2, "reward_mean": 0.5}), "'pass_rate' must be a number, got None"),
        (json.dumps(record(2, pass_rate=1.5)), "'pass_rate' must lie in [0, 1], got 1.5"),
        (json.dumps(record(2, eval_pass_rate=float("nan"))), "'eval_pass_rate' must lie in [0, 1], got nan"),
        (json.dumps(record(2, loss="high")), "'loss' must be a number or absent, got 'high'"),
    ],
)
def test_a_line_without_usable_fields_is_an_error_even_when_last(tmp_path: Path, line: str, detail: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(record(1)) + "\n" + line + "\n")
    with pytest.raises(MalformedMetricsError) as caught:
        read_metrics(path)
    assert (caught.value.line, caught.value.detail) == (2, detail)


def test_an_empty_file_reads_as_no_records(tmp_path: Path) -> None:
    assert read_metrics(write_jsonl(tmp_path / "empty.jsonl", [])) == []
    assert read_metrics(write_jsonl(tmp_path / "blank.jsonl", [], tail="\n\n  \n")) == []


# --- prime-train plot -----------------------------------------------------------------------------------


def test_cli_plot_prints_path_steps_and_pass_rates(tmp_path: Path) -> None:
    metrics = write_jsonl(tmp_path / "metrics.jsonl", run_records(10))
    out = tmp_path / "reward.png"
    result = runner.invoke(app, ["plot", "--metrics", str(metrics), "--out", str(out), "--title", "run 1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "plotted 10 steps (1 to 10), 2 held-out evaluations",
        "pass rate: 5.0% at step 1, 50.0% at step 10",
        f"path:      {out.resolve()}",
    ]
    assert png_size(out)[0] == round(WIDTH_IN * DPI)


def test_cli_plot_json_output(tmp_path: Path) -> None:
    metrics = write_jsonl(tmp_path / "metrics.jsonl", run_records(4, optimizer=False))
    out = tmp_path / "reward.png"
    result = runner.invoke(app, ["plot", "--metrics", str(metrics), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "path": str(out.resolve()),
        "steps": 4,
        "eval_points": 1,
        "first_step": 1,
        "last_step": 4,
        "first_pass_rate": 0.05,
        "last_pass_rate": 0.2,
    }


def test_cli_plot_warns_on_a_partial_last_line_and_still_plots(tmp_path: Path) -> None:
    metrics = write_jsonl(tmp_path / "metrics.jsonl", run_records(3), tail='{"step": 4')
    out = tmp_path / "reward.png"
    result = runner.invoke(app, ["plot", "--metrics", str(metrics), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == 3
    assert "line 4: skipped a partial last line" in result.stderr
    assert out.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no metrics records yet"),
        (json.dumps(record(1)) + "\nnot json\n" + json.dumps(record(2)) + "\n", "line 2: not JSON"),
    ],
)
def test_cli_plot_fails_in_one_line_on_an_empty_or_malformed_file(tmp_path: Path, content: str, message: str) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(content)
    out = tmp_path / "reward.png"
    result = runner.invoke(app, ["plot", "--metrics", str(metrics), "--out", str(out)], env={"PRIME_DEBUG": None})
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {metrics}") and message in line
    assert not out.exists()


def test_cli_plot_help_does_not_import_matplotlib() -> None:
    code = (
        "import sys\n"
        "from trainer.cli import app\n"
        "try:\n"
        "    app(['plot', '--help'], prog_name='prime-train')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "print('MATPLOTLIB', 'matplotlib' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "--metrics" in result.stdout
    assert "MATPLOTLIB False" in result.stdout
