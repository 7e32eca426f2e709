"""Training metrics read back from their JSONL file and drawn as a reward curve (PNG).

The training loop appends one JSON object a line, one line a policy step. The fields drawn here:

    step             int, the policy step the update produced          (required)
    reward_mean      float, mean reward of the step's rollouts         (required)
    pass_rate        float in [0, 1], share of rollouts that passed    (required)
    eval_pass_rate   float in [0, 1], a held-out evaluation            (some lines only)
    loss, grad_norm  floats from the optimizer step                    (optional)

Every other field (seconds, clipped_fraction, tokens_per_s, ...) is ignored, so the writer can add fields
without breaking the plot. matplotlib loads inside `draw`, so reading metrics stays light.

A step's reward and pass rate come from a few dozen rollouts, so they jump by several points from step to step. Each
per-step series is drawn thin and light, and over it, bold in the same colour, its exponential moving average with
bias correction (`smooth`, TensorBoard's smoothing). An EMA rather than a centred rolling mean: the point at step t
uses steps up to t only, so the curve ends on the last step with no window narrowing (and growing noisier) toward
the end, and a NaN (a diverged loss) is simply skipped. It lags a change by about its time constant, 1 / (1 - weight)
steps; `smoothing_weight` sets that to a tenth of the run, 5 to 20 steps (weight 0.8 to 0.95): less barely smooths
a few dozen rollouts' noise, more trails a real change by over 20 steps. The held-out evaluations are points at the
steps that ran one, joined by a thin dashed line only to guide the eye.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protocol.rollouts.writer import publish_atomically
from trainer.errors import TrainerError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

REQUIRED_NUMBERS = ("reward_mean", "pass_rate")
OPTIONAL_NUMBERS = ("eval_pass_rate", "loss", "grad_norm")  # null counts as absent
RATES = ("pass_rate", "eval_pass_rate")  # shares, so in [0, 1]

WIDTH_IN, PANEL_HEIGHT_IN, DPI = 9.0, 3.5, 120  # the PNG is 1080 px wide and 420 px high a panel
MARKED_LINE_MAX_POINTS = 50  # up to this many steps the curves also mark each point, so one step still shows
PER_STEP_ALPHA, PER_STEP_WIDTH, SMOOTHED_WIDTH = 0.3, 1.0, 2.2  # the per-step line light, its smoothed curve bold
SMOOTHING_STEPS_MIN, SMOOTHING_STEPS_MAX = 5, 20  # bounds on the EMA's time constant, in steps
HELD_OUT_GID = "eval_pass_rate:held-out"  # each line has a gid (field:kind) by which tests find it


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
    """What `plot_metrics` drew: counts of steps, evaluations and panels, and the pass rate at both ends."""

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


def panel_count(rows: Sequence[dict[str, Any]]) -> int:
    """1, or 2 when a row logged loss or grad norm (they get a panel below the reward's)."""
    return 2 if any(row.get(name) is not None for row in rows for name in ("loss", "grad_norm")) else 1


def smoothing_weight(steps: int) -> float:
    """The EMA weight for a run of `steps` points: a time constant of a tenth of the run, 5 to 20 steps."""
    time_constant = min(max(steps / 10, SMOOTHING_STEPS_MIN), SMOOTHING_STEPS_MAX)
    return 1 - 1 / time_constant


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """The exponential moving average of `values` with bias correction, one point a value (TensorBoard's smoothing).

    The average starts at 0 and is divided by 1 - weight ** n over the n finite values seen so far, so the first
    point is the first value and a constant stays constant. Point i uses values 0 to i only: the curve follows a
    change after about 1 / (1 - weight) points and ends on the last value's point. A NaN or infinite value stays NaN
    (a gap in the drawn line) and is left out of the average, so it does not spread to the points after it.
    """
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must lie in [0, 1), got {weight!r}")
    smoothed: list[float] = []
    average, seen = 0.0, 0
    for value in values:
        if not math.isfinite(value):
            smoothed.append(math.nan)
            continue
        average = weight * average + (1 - weight) * value
        seen += 1
        smoothed.append(average / (1 - weight**seen))
    return smoothed


def draw_smoothed(
    axis: Axes, rows: Sequence[dict[str, Any]], name: str, *, color: str, weight: float, scale: float = 1.0
) -> list[Line2D]:
    """Draw field `name` per step, thin and light, and its smoothed curve over it, bold, in one colour.

    Returns the two lines (none when no row carries the field); their gids are `name:per-step` and `name:smoothed`.
    """
    steps, values = series(rows, name, scale)
    if not steps:
        return []
    label = name.replace("_", " ")
    marker = "." if len(steps) <= MARKED_LINE_MAX_POINTS else None
    return [
        *axis.plot(
            steps,
            values,
            color=color,
            alpha=PER_STEP_ALPHA,
            linewidth=PER_STEP_WIDTH,
            marker=marker,
            label=f"{label}, per step",
            gid=f"{name}:per-step",
        ),
        *axis.plot(
            steps,
            smooth(values, weight),
            color=color,
            linewidth=SMOOTHED_WIDTH,
            label=f"{label}, smoothed (EMA {weight:.2f})",
            gid=f"{name}:smoothed",
        ),
    ]


def draw(records: Sequence[dict[str, Any]], *, title: str | None = None) -> Figure:
    """The figure of a run: reward mean and pass rate (%) against step, each per step and smoothed, the held-out
    evaluations as points on the pass-rate axis, and a loss / grad norm panel when either was logged.

    A Figure on an explicit Agg canvas (no display, and no process-wide backend switch, so a notebook's interactive
    backend is left alone). Each line's gid names its field and kind: `pass_rate:per-step`, `pass_rate:smoothed`,
    `HELD_OUT_GID`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not records:
        raise NoMetricsError("no metrics records to plot")
    rows = latest_per_step(records)
    panels = panel_count(rows)
    weight = smoothing_weight(len(rows))

    figure = Figure(figsize=(WIDTH_IN, PANEL_HEIGHT_IN * panels), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    if title:
        figure.suptitle(title)

    # top panel: reward on the left axis, pass rates (percent) on the right, training and held-out
    reward_axis = axes[0]
    rate_axis = reward_axis.twinx()
    lines = draw_smoothed(reward_axis, rows, "reward_mean", color="C0", weight=weight)
    lines += draw_smoothed(rate_axis, rows, "pass_rate", color="C1", weight=weight, scale=100)
    eval_steps, eval_rates = series(rows, "eval_pass_rate", 100)
    if eval_steps:  # points where an evaluation ran; the dashed line only guides the eye from one to the next
        lines += rate_axis.plot(
            eval_steps,
            eval_rates,
            color="C3",
            linestyle="--",
            linewidth=0.8,
            marker="o",
            markersize=6,
            label="held-out evaluation",
            gid=HELD_OUT_GID,
        )
    reward_axis.set_ylabel("reward mean")
    rate_axis.set_ylabel("pass rate (%)")
    rate_axis.set_ylim(-2, 102)
    reward_axis.grid(alpha=0.3)
    rate_axis.legend(handles=lines, loc="upper left", fontsize="small")  # the twin is drawn on top: no line over it

    if panels == 2:  # bottom panel: loss on the left axis, grad norm on the right (their scales differ)
        lines, axis = [], axes[1]
        for name, color in (("loss", "C2"), ("grad_norm", "C4")):
            if not any(row.get(name) is not None for row in rows):
                continue  # only one of the two was logged: draw it alone, with no empty axis
            axis = axes[1].twinx() if lines else axes[1]
            lines += draw_smoothed(axis, rows, name, color=color, weight=weight)
            axis.set_ylabel(name.replace("_", " "))
        axes[1].grid(alpha=0.3)
        axis.legend(handles=lines, loc="upper right", fontsize="small")  # on the axis drawn last, above every line
    axes[-1].set_xlabel("policy step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole; no ticks at 1.25
    return figure


def plot_metrics(records: Sequence[dict[str, Any]], out_png: Path | str, *, title: str | None = None) -> PlotSummary:
    """Draw the records (`draw`) and write the PNG atomically to `out_png` (its directory is created)."""
    figure = draw(records, title=title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    publish_atomically(out, buffer.getvalue())
    rows = latest_per_step(records)
    return PlotSummary(
        path=out,
        steps=len(rows),
        eval_points=len(series(rows, "eval_pass_rate")[0]),
        panels=panel_count(rows),
        first_step=rows[0]["step"],
        last_step=rows[-1]["step"],
        first_pass_rate=float(rows[0]["pass_rate"]),
        last_pass_rate=float(rows[-1]["pass_rate"]),
    )
