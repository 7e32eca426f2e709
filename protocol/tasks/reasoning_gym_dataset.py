"""What a spec's reasoning-gym source is, without building it: its problem ids (`ProblemIds`) and whether
reasoning-gym accepts its dataset config (`config_error`). The spec loader uses these; the source is
`protocol.tasks.reasoning_gym_source`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, overload


class ProblemIds(Sequence[str]):
    """The ids "<dataset>/<i>" for i in range(size), made on demand (sizes can be millions)."""

    def __init__(self, dataset: str, size: int) -> None:
        self.prefix = f"{dataset}/"
        self.size = size

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        if not -self.size <= index < self.size:
            raise IndexError(index)
        return f"{self.prefix}{index % self.size}"

    def index_of(self, problem_id: str) -> int | None:
        """The i of a canonical id ("x/17", never "x/017" or "x/+17"), or None."""
        if not problem_id.startswith(self.prefix):
            return None
        digits = problem_id[len(self.prefix) :]
        if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
            return None
        index = int(digits)
        return index if index < self.size else None


def config_error(dataset: str, seed: int, size: int, config: dict[str, Any]) -> tuple[str, str] | None:
    """(spec field, why) reasoning-gym would refuse this dataset config, or None when it accepts it."""
    import reasoning_gym  # noqa: F401  # registers every dataset
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        return "source.dataset", f"unknown reasoning-gym dataset {dataset!r}"
    config_cls = DATASETS[dataset][1]
    known = {f.name for f in dataclasses.fields(config_cls)} - {"seed", "size"}
    unknown = sorted(set(config) - known)
    if unknown:
        return "source.config", f"{dataset} has no key(s) {', '.join(unknown)}; it knows {', '.join(sorted(known))}"
    try:
        made = config_cls(**config, seed=seed, size=size)
        if hasattr(made, "validate"):
            made.validate()
    except (AssertionError, TypeError, ValueError) as exc:
        return "source.config", f"{dataset} rejects it: {exc}"
    return None
