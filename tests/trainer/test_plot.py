"""Metrics JSONL read back (blank, partial and malformed lines), smoothed, and drawn to PNG; `prime-train plot`."""

from __future__ import annotations

import itertools
import json
import math
import random
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.lines import Line2D
from typer.testing import CliRunner

from trainer.cli import app
from trainer.errors import TrainerError
from trainer.plot import (
    DPI,
    HELD_OUT_GID,
    PANEL_HEIGHT_IN,
    WIDTH_IN,
    MalformedMetricsError,
    NoMetricsError,
    PartialLastLineWarning,
    draw,
    plot_metrics,
    read_metrics,
    smooth,
    smoothing_weight,
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


# --- smoothing ------------------------------------------------------------------------------------------


def test_smooth_keeps_a_constant_series_constant_from_its_first_point() -> None:
    for weight in (0.0, 0.5, 0.9, 0.95):
        assert smooth([0.42] * 30, weight) == pytest.approx([0.42] * 30)  # bias correction: no ramp up from 0


def test_smooth_follows_a_step_change_with_a_lag_and_no_overshoot() -> None:
    smoothed = smooth([0.0] * 20 + [1.0] * 60, 0.9)
    assert smoothed[:20] == pytest.approx([0.0] * 20)
    assert smoothed[20] < 0.2  # the first step after the change moves it only a little
    halfway = next(i for i, value in enumerate(smoothed) if value >= 0.5)
    assert 24 <= halfway <= 28  # ln 2 / -ln 0.9 = 6.6 steps after the change
    assert all(a <= b <= 1 for a, b in itertools.pairwise(smoothed[20:]))
    assert smoothed[-1] == pytest.approx(1.0, abs=0.01)


def test_smooth_skips_nan_and_infinite_values_without_spreading_them() -> None:
    values = [1.0, 2.0, math.nan, 3.0, math.inf, 4.0]
    smoothed = smooth(values, 0.5)
    assert len(smoothed) == len(values)
    assert math.isnan(smoothed[2]) and math.isnan(smoothed[4])  # a gap where the value is missing
    finite = smooth([1.0, 2.0, 3.0, 4.0], 0.5)
    assert [smoothed[i] for i in (0, 1, 3, 5)] == pytest.approx(finite)  # as if the gaps were not there
    assert smooth([math.nan, 5.0], 0.9) == [pytest.approx(math.nan, nan_ok=True), pytest.approx(5.0)]


def test_smooth_preserves_length_and_a_single_point_and_weight_zero_is_the_identity() -> None:
    assert smooth([], 0.9) == []
    assert smooth([7.5], 0.95) == pytest.approx([7.5])
    values = [random.Random(1).random() for _ in range(40)]
    assert smooth(values, 0.0) == pytest.approx(values)
    assert len(smooth(values, 0.9)) == 40


def test_smooth_brings_a_noisy_series_closer_to_its_trend() -> None:
    rng = random.Random(0)
    trend = [0.3 + 0.001 * step for step in range(200)]  # +20 points in 200 steps, under 6 points of noise a step
    noisy = [value + rng.gauss(0, 0.06) for value in trend]
    smoothed = smooth(noisy, smoothing_weight(len(noisy)))

    def error(series: list[float]) -> float:
        return sum((a - b) ** 2 for a, b in zip(series, trend, strict=True)) / len(trend)

    def jumps(series: list[float]) -> float:
        return sum(abs(b - a) for a, b in itertools.pairwise(series))

    assert error(smoothed) < error(noisy) / 3  # the lag (20 steps of 0.001) costs less than the noise it removes
    assert jumps(smoothed) < jumps(noisy) / 10


@pytest.mark.parametrize("weight", [-0.1, 1.0, 1.5, math.nan])
def test_smooth_refuses_a_weight_outside_0_to_1(weight: float) -> None:
    with pytest.raises(ValueError, match="smoothing weight must lie in"):
        smooth([1.0], weight)


def test_smoothing_weight_sets_a_time_constant_of_a_tenth_of_the_run_from_5_to_20_steps() -> None:
    time_constants = {steps: 1 / (1 - smoothing_weight(steps)) for steps in (1, 10, 50, 120, 200, 10_000)}
    assert time_constants == pytest.approx({1: 5, 10: 5, 50: 5, 120: 12, 200: 20, 10_000: 20})


# --- the figure -----------------------------------------------------------------------------------------


def lines_by_gid(figure: Figure) -> dict[str, Line2D]:
    """The figure's named lines: `reward_mean:per-step`, `reward_mean:smoothed`, ..., `HELD_OUT_GID`."""
    return {str(line.get_gid()): line for axis in figure.axes for line in axis.get_lines() if line.get_gid()}


def xs(line: Line2D) -> list[float]:
    return [float(x) for x in np.asarray(line.get_xdata(), dtype=float)]


def ys(line: Line2D) -> list[float]:
    return [float(y) for y in np.asarray(line.get_ydata(), dtype=float)]


def legend_texts(figure: Figure) -> list[str]:
    legends = [legend for axis in figure.axes if (legend := axis.get_legend()) is not None]
    return [text.get_text() for legend in legends for text in legend.get_texts()]


@pytest.mark.parametrize("name", ["reward_mean", "pass_rate", "loss", "grad_norm"])
def test_each_per_step_line_is_light_with_its_smoothed_curve_bold_over_it(name: str) -> None:
    lines = lines_by_gid(draw(run_records(30)))
    raw, smoothed = lines[f"{name}:per-step"], lines[f"{name}:smoothed"]
    axis = raw.axes
    assert axis is not None and smoothed.axes is axis
    assert raw.get_color() == smoothed.get_color()
    assert raw.get_alpha() == pytest.approx(0.3) and smoothed.get_alpha() in (None, 1.0)
    assert smoothed.get_linewidth() > 2 * raw.get_linewidth()
    assert axis.get_lines().index(smoothed) > axis.get_lines().index(raw)  # drawn after, so on top
    assert xs(smoothed) == xs(raw) == list(range(1, 31))  # every step, ending on the last one
    assert ys(smoothed) == pytest.approx(smooth(ys(raw), smoothing_weight(30)))
    assert ys(smoothed) != pytest.approx(ys(raw))


def test_held_out_evaluations_are_points_at_their_steps_on_the_pass_rate_axis() -> None:
    records = run_records(12, eval_every=3)  # steps 3, 6, 9, 12
    records[5]["eval_pass_rate"] = None  # step 6 logged null: no point there, nothing interpolated
    lines = lines_by_gid(draw(records))
    held_out = lines[HELD_OUT_GID]
    assert xs(held_out) == [3, 9, 12]
    assert ys(held_out) == pytest.approx([12.0, 36.0, 48.0])  # percent, like the pass rate
    assert held_out.get_marker() == "o" and held_out.get_markersize() >= 5
    assert held_out.get_linestyle() in ("--", ":", "None") and held_out.get_linewidth() <= 1
    assert held_out.axes is lines["pass_rate:per-step"].axes


def test_legend_names_per_step_smoothed_and_held_out_lines() -> None:
    texts = legend_texts(draw(run_records(30, eval_every=10)))
    weight = f"{smoothing_weight(30):.2f}"
    assert texts == [
        "reward mean, per step",
        f"reward mean, smoothed (EMA {weight})",
        "pass rate, per step",
        f"pass rate, smoothed (EMA {weight})",
        "held-out evaluation",
        "loss, per step",
        f"loss, smoothed (EMA {weight})",
        "grad norm, per step",
        f"grad norm, smoothed (EMA {weight})",
    ]


def test_no_held_out_entry_when_no_evaluation_ran() -> None:
    figure = draw(run_records(8, eval_every=100, optimizer=False))
    assert HELD_OUT_GID not in lines_by_gid(figure)
    assert not any("held-out" in text for text in legend_texts(figure))


def test_a_nan_loss_leaves_a_gap_in_both_lines_and_the_curve_goes_on_after_it(tmp_path: Path) -> None:
    records = run_records(10)
    records[4]["loss"] = float("nan")  # step 5 diverged; JSON writes it as NaN and reads it back
    lines = lines_by_gid(draw(read_metrics(write_jsonl(tmp_path / "m.jsonl", records))))
    raw, smoothed = ys(lines["loss:per-step"]), ys(lines["loss:smoothed"])
    assert math.isnan(raw[4]) and math.isnan(smoothed[4])
    assert all(math.isfinite(value) for i, value in enumerate(smoothed) if i != 4)


def test_a_single_step_draws_its_point_and_a_one_point_smoothed_curve() -> None:
    lines = lines_by_gid(draw([record(1, eval_pass_rate=0.5)]))
    assert ys(lines["pass_rate:smoothed"]) == pytest.approx([5.0])
    assert lines["pass_rate:per-step"].get_marker() == "."  # a lone point is still seen
    assert xs(lines[HELD_OUT_GID]) == [1]


def test_draw_refuses_no_records() -> None:
    with pytest.raises(NoMetricsError, match="no metrics"):
        draw([])


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
