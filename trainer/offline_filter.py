"""The offline filter (DESIGN section 8): keep the problems whose base-model pass rate lies in a band.

A problem the base model always solves, or never solves, gives GRPO groups whose rewards are all equal: zero
advantage, no gradient. Measuring each problem's pass rate once, before training, and keeping only those inside
[low, high] spends the pool's rollouts where there is signal.

The result is a new task spec: a copy of the TOML with `[source] problems = "<name>.problems.txt"` and that list
of ids beside it. The list is part of the spec hash (protocol/tasks/filtered_source.py, docs/offline-filter.md), so
workers and validators that assign problems from it agree, or fail loudly on the hash.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.model.loading import LoadedModel
from protocol.tasks.problem_list import list_bytes
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec, load_task_spec
from trainer.errors import TrainerError
from trainer.evaluate import sample_rewards

_SOURCE_HEADER = re.compile(r"^\s*\[\s*source\s*\]\s*(#.*)?$")
_ANY_HEADER = re.compile(r"^\s*\[")


class OfflineFilterError(TrainerError, ValueError):
    """Filter arguments or outputs that do not work (a bad band, no problem kept, an output in the way).

    A ValueError too, like `GRPOError`: it is bad input, and the CLIs print those as one line.
    """


@dataclass(frozen=True)
class PassBand:
    """Inclusive bounds on a problem's pass rate; 0 <= low <= high <= 1."""

    low: float = 0.1
    high: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise OfflineFilterError(f"the band needs 0 <= min <= max <= 1, got min {self.low} and max {self.high}")

    def __contains__(self, rate: float) -> bool:
        return self.low <= rate <= self.high


def measure_pass_rates(
    loaded: LoadedModel,
    spec: TaskSpec,
    source: TaskSource,
    problem_ids: Sequence[str],
    *,
    samples: int = 8,
    seed: int = 0,
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Each problem's pass rate: the fraction of `samples` completions, drawn with the task's sampling parameters,
    whose task reward is 1 (as `trainer.evaluate.PassRate.of` counts a pass). Keys follow `problem_ids`' order.

    Completion k of problem i uses seed `seed + i * samples + k`, so a run is reproducible; a task with a thinking
    budget asks for the target `target_length_for(spec, id, seed)`, one per problem.
    """
    if samples < 1:
        raise OfflineFilterError(f"samples must be >= 1, got {samples}")
    rewards = sample_rewards(
        loaded, spec, source, problem_ids, samples=samples, seed=seed, batch_size=batch_size, progress=progress
    )
    return {
        pid: sum(r.task_reward >= 1.0 for r in group) / samples for pid, group in zip(problem_ids, rewards, strict=True)
    }


def select_in_band(rates: Mapping[str, float], band: PassBand) -> list[str]:
    """The ids whose rate lies in the band, in the order of `rates`; raises when none does (a task needs one)."""
    kept = [pid for pid, rate in rates.items() if rate in band]
    if not kept:
        seen = f"rates seen: {min(rates.values()):.3f} to {max(rates.values()):.3f}" if rates else "nothing measured"
        raise OfflineFilterError(
            f"no problem of {len(rates)} has a pass rate in [{band.low}, {band.high}] ({seen}); "
            "widen the band, or measure more problems or samples"
        )
    return kept


def rate_histogram(rates: Mapping[str, float]) -> list[tuple[float, int]]:
    """(rate, number of problems with it), by rate: with G samples a rate is one of k / G, so this is exact."""
    return sorted(Counter(rates.values()).items())


def problem_list_path(out_toml: Path) -> Path:
    """Where the list of a spec written to `out_toml` goes: beside it, "<stem>.problems.txt"."""
    return out_toml.with_name(f"{out_toml.stem}.problems.txt")


def check_outputs(spec_path: Path, out_toml: Path, *, overwrite: bool) -> None:
    """Refuse, before any measuring, an output that is the input spec, or one that exists without `overwrite`."""
    if out_toml.resolve() == spec_path.resolve():
        raise OfflineFilterError(f"--out {out_toml} is the spec being filtered; choose another file")
    if not overwrite:
        for target in (out_toml, problem_list_path(out_toml)):
            if target.exists():
                raise OfflineFilterError(f"refusing to overwrite {target} (pass --overwrite to replace it)")


def write_filtered_spec(
    spec_path: str | Path, kept_ids: Sequence[str], out_toml: str | Path, *, overwrite: bool = False
) -> TaskSpec:
    """Write `kept_ids` beside `out_toml` and a copy of the spec there that names them; returns the loaded copy.

    The copy is the original text with `problems = ...` set in `[source]` (comments kept), and a JSONL `path`
    rewritten for the new location when the copy lives elsewhere. Loading the copy checks every id.
    """
    spec_path, out_toml = Path(spec_path), Path(out_toml)
    if not kept_ids:
        raise OfflineFilterError("refusing to write a task spec with no problems")
    check_outputs(spec_path, out_toml, overwrite=overwrite)
    original = load_task_spec(spec_path)
    list_path = problem_list_path(out_toml)
    values = {"problems": list_path.name}
    data_path = getattr(original.source, "path", None)  # the JSONL of math_jsonl and code sources
    out_dir = out_toml.parent.resolve()
    if isinstance(data_path, Path) and out_dir != original.path.parent:
        # Relative when both lie in one tree (a repository moves as a whole), absolute when they share only "/".
        shared = Path(os.path.commonpath([data_path, out_dir]))
        values["path"] = (
            Path(os.path.relpath(data_path, out_dir)) if shared.parent != shared else data_path
        ).as_posix()
    text = set_source_keys(spec_path, spec_path.read_text(encoding="utf-8"), values)
    out_toml.parent.mkdir(parents=True, exist_ok=True)
    list_path.write_bytes(list_bytes(kept_ids))
    out_toml.write_text(text, encoding="utf-8")
    try:
        return load_task_spec(out_toml)
    except Exception:
        out_toml.unlink(missing_ok=True)
        list_path.unlink(missing_ok=True)
        raise


def set_source_keys(spec_path: Path, text: str, values: Mapping[str, str]) -> str:
    """The TOML `text` with each key of `values` set to that string in its `[source]` table, all else as it was.

    A text edit, since tomllib only reads: the key's line is replaced, or a line is added after the table's last
    entry. The result is parsed and compared with the intended table, so an unusual layout (an inline `source`
    table, dotted keys) is refused instead of written wrong.
    """
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _SOURCE_HEADER.match(line)), None)
    if start is not None:
        end = next((i for i in range(start + 1, len(lines)) if _ANY_HEADER.match(lines[i])), len(lines))
        for key, value in values.items():
            line = f"{key} = {json.dumps(value, ensure_ascii=False)}\n"
            if key == "problems":
                line = line[:-1] + "   # written by `prime-train filter`; the ids are part of the spec hash\n"
            pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
            found = next((i for i in range(start + 1, end) if pattern.match(lines[i])), None)
            if found is not None:
                lines[found] = line
                continue
            last = max(i for i in range(start, end) if lines[i].strip() and not lines[i].lstrip().startswith("#"))
            if not lines[last].endswith("\n"):
                lines[last] += "\n"
            lines.insert(last + 1, line)
            end += 1
    edited = "".join(lines)
    expected: dict[str, Any] = tomllib.loads(text)
    expected["source"] = {**expected["source"], **values}
    try:
        matches = start is not None and tomllib.loads(edited) == expected
    except tomllib.TOMLDecodeError:
        matches = False
    if not matches:
        raise OfflineFilterError(
            f"cannot set {', '.join(values)} in {spec_path}: it needs a plain [source] table header; "
            "edit a copy by hand instead"
        )
    return edited
