"""Training metrics read back from their JSONL file and drawn as a reward curve (PNG).

The training loop appends one JSON object a line, one line a policy step. The fields drawn here:

    step             int, the policy step the update produced          (required)
    reward_mean      float, mean reward of the step's rollouts         (required)
    pass_rate        float in [0, 1], share of rollouts that passed    (required)
    eval_pass_rate   float in [0, 1], a held-out evaluation            (some lines only)
    loss, grad_norm  floats from the optimizer step                    (optional)

Every other field (seconds, clipped_fraction, tokens_per_s, ...) is ignored, so the writer can add fields
without breaking the plot. matplotlib loads inside `plot_metrics`, so reading metrics stays light.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.rollouts.writer import publish_atomically
from trainer.errors import TrainerError

REQUIRED_NUMBERS = ("reward_mean", "pass_rate")
OPTIONAL_NUMBERS = ("eval_pass_rate", "loss", "grad_norm")  # null counts as absent
RATES = ("pass_rate", "eval_pass_rate")  # shares, so in [0, 1]

WIDTH_IN, PANEL_HEIGHT_IN, DPI = 9.0, 3.5, 120  # the PNG is 1080 px wide and 420 px high a panel
MARKED_LINE_MAX_POINTS = 50  # up to this many steps the curves also mark each point, so one step still shows


class MalformedMetricsError(TrainerError, ValueError):
    """A line of a metrics file, not the last, is not a metrics record."""

    def __init__(self, path: Path, line: int, detail: str) -> None:
        super().__init__(f"{path}, line {line}: {detail}")
        self.path = path
        self.line = line
        self.detail = detail


class NoMetricsError(TrainerError, ValueError):
    """There is nothing to plot: the metrics file holds no records yet."""


class PartialLastLineWarning(UserWarning):
    """The last line of a metrics file is not JSON, as when the writer died mid-line; it was skipped."""


@dataclass(frozen=True)
class PlotSummary:
    """What `plot_metrics` drew: counts read from the figure's own artists, and the pass rate at both ends."""

    path: Path
    steps: int  # points on the training curves (distinct steps)
    eval_points: int  # held-out evaluations drawn as markers
    panels: int  # 1, or 2 when loss or grad norm was logged
    first_step: int
    last_step: int
    first_pass_rate: float
    last_pass_rate: float


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """The records of a metrics JSONL file, in file order; blank lines are skipped.

    A last line that is not JSON (a writer that crashed mid-line) is skipped with a `PartialLastLineWarning`;
    any other bad line raises `MalformedMetricsError` naming the file and line number.
    """
    path = Path(path)
    lines = [(number, raw) for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1) if raw.strip()]
    records: list[dict[str, Any]] = []
    for index, (number, raw) in enumerate(lines):
        try:
            record = json.loads(raw)  # bytes: a line cut inside a UTF-8 character fails here too
        except ValueError as exc:
            detail = f"not JSON ({exc.msg})" if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
            if index == len(lines) - 1:
                warnings.warn(
                    f"{path}, line {number}: skipped a partial last line, {detail}",
                    PartialLastLineWarning,
                    stacklevel=2,
                )
                break
            raise MalformedMetricsError(path, number, detail) from exc
        check_record(path, number, record)
        records.append(record)
    return records


def check_record(path: Path, line: int, record: object) -> None:
    """Raise `MalformedMetricsError` unless `record` has the fields the plot needs, with usable values."""
    if not isinstance(record, dict):
        raise MalformedMetricsError(path, line, f"expected a JSON object, got {type(record).__name__}")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise MalformedMetricsError(path, line, f"'step' must be a non-negative integer, got {step!r}")
    for name in REQUIRED_NUMBERS:
        if not is_number(record.get(name)):
            raise MalformedMetricsError(path, line, f"{name!r} must be a number, got {record.get(name)!r}")
    for name in OPTIONAL_NUMBERS:
        if record.get(name) is not None and not is_number(record[name]):
            raise MalformedMetricsError(path, line, f"{name!r} must be a number or absent, got {record[name]!r}")
    for name in RATES:
        value = record.get(name)
        if value is not None and not 0 <= value <= 1:  # NaN fails this too
            raise MalformedMetricsError(path, line, f"{name!r} must lie in [0, 1], got {value!r}")


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def latest_per_step(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record a step, in step order; a step logged twice (a run resumed from a checkpoint) keeps its later line."""
    by_step = {record["step"]: record for record in records}
    return [by_step[step] for step in sorted(by_step)]


def series(records: Sequence[dict[str, Any]], name: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    """The (steps, values) of one field over the records that carry it."""
    points = [(record["step"], float(record[name]) * scale) for record in records if record.get(name) is not None]
    return [step for step, _ in points], [value for _, value in points]


def plot_metrics(records: Sequence[dict[str, Any]], out_png: Path | str, *, title: str | None = None) -> PlotSummary:
    """Draw reward mean and pass rate (%) against step, eval pass rate as markers, and a loss / grad norm panel
    when either was logged; write the PNG atomically to `out_png` (its directory is created).

    Renders on an explicit Agg canvas (no display, and no process-wide backend switch, so a notebook's
    interactive backend is left alone).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not records:
        raise NoMetricsError("no metrics records to plot")
    rows = latest_per_step(records)
    has_optimizer = any(row.get(name) is not None for row in rows for name in ("loss", "grad_norm"))
    panels = 2 if has_optimizer else 1
    marker = "." if len(rows) <= MARKED_LINE_MAX_POINTS else None

    figure = Figure(figsize=(WIDTH_IN, PANEL_HEIGHT_IN * panels), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    if title:
        figure.suptitle(title)

    # top panel: reward on the left axis, pass rates (percent) on the right, training and held-out
    reward_axis = axes[0]
    rate_axis = reward_axis.twinx()
    lines = reward_axis.plot(*series(rows, "reward_mean"), color="C0", marker=marker, label="reward mean")
    lines += rate_axis.plot(*series(rows, "pass_rate", 100), color="C1", marker=marker, label="pass rate")
    (eval_line,) = rate_axis.plot(
        *series(rows, "eval_pass_rate", 100),
        color="C3",
        linestyle="none",
        marker="D",
        markersize=6,
        label="eval pass rate (held out)",
    )
    if len(eval_line.get_xdata()):
        lines.append(eval_line)
    reward_axis.set_ylabel("reward mean")
    rate_axis.set_ylabel("pass rate (%)")
    rate_axis.set_ylim(-2, 102)
    reward_axis.grid(alpha=0.3)
    reward_axis.legend(handles=lines, loc="upper left")

    if has_optimizer:  # bottom panel: loss on the left axis, grad norm on the right (their scales differ)
        lines = []
        for name, color in (("loss", "C2"), ("grad_norm", "C4")):
            steps, values = series(rows, name)
            if not steps:
                continue  # only one of the two was logged: draw it alone, with no empty axis
            axis = axes[1].twinx() if lines else axes[1]
            lines += axis.plot(steps, values, color=color, marker=marker, label=name.replace("_", " "))
            axis.set_ylabel(name.replace("_", " "))
        axes[1].grid(alpha=0.3)
        axes[1].legend(handles=lines, loc="upper right")
    axes[-1].set_xlabel("policy step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole; no ticks at 1.25

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    publish_atomically(out, buffer.getvalue())
    return PlotSummary(
        path=out,
        steps=len(rows),
        eval_points=len(eval_line.get_xdata()),
        panels=panels,
        first_step=rows[0]["step"],
        last_step=rows[-1]["step"],
        first_pass_rate=float(rows[0]["pass_rate"]),
        last_pass_rate=float(rows[-1]["pass_rate"]),
    )
