"""Where a role's time goes: one JSON line for each stage of its work, when `PRIME_TRACE` names a folder.

A daemon command calls `configure_tracing(role)` at start-up, next to its logging set-up (the variable is read
there, at the command-line edge, and nowhere deeper). From then on `span(stage, ...)` and `record(stage, ...)`
append one line to `<folder>/<role>-<pid>.jsonl`:

    {"role": "worker", "stage": "generate", "at": 1764800000.123, "seconds": 4.21, "step": 12, "key": "ab12..."}

`at` is the wall clock when the stage ended (so lines of different processes on one machine line up), `seconds`
its duration; the other fields say what it worked on (a policy step, a work key's first hex digits). With the
variable unset nothing is opened and each call costs one attribute read: the stages stay in the code for good.

The stages (`benchmarks/network_learning.py` prints their medians, docs/trainer.md explains them):
- worker: `hold` (waiting for the step's policy; 0 when it was prefetched), `fetch` (a policy's checkpoint through
  SHARDCAST), `load` (into the inference engine), `generate`, `prove` (scoring and the TOPLOC proofs), `upload`,
  `submit` (the chain transaction), `wait` (no work offered);
- validator: `queue` (a submission's wait to be verified), `download` (the file from the coordinator), `fetch` and
  `load` (a step's checkpoint, within `verify`), `verify` (every check, the recomputation included),
  `attest` (the signed verdict posted to the coordinator);
- trainer: `wait` (for enough accepted rows), `train`, `checkpoint` (the policy and the state written), `publish`
  (through the SHARDCAST origin), `evaluate`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

TRACE_ENV_VAR = "PRIME_TRACE"


class Tracer:
    """Appends one line a stage to its file; thread-safe. A tracer without a file records nothing."""

    def __init__(self, role: str, path: Path | None) -> None:
        self.role, self.path = role, path
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", buffering=1, encoding="utf-8")  # a line at a time: a crash loses none

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def record(self, stage: str, seconds: float, **fields: object) -> None:
        """One stage of `seconds` that ended now."""
        if self._file is None:
            return
        line = {"role": self.role, "stage": stage, "at": round(time.time(), 3), "seconds": round(seconds, 4)}
        line.update(fields)
        text = json.dumps(line, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            self._file.write(text)

    @contextmanager
    def span(self, stage: str, **fields: object) -> Iterator[None]:
        """Records the block's duration as `stage` when it ends without an exception (a failed stage is retried
        and shows up as the retry's line)."""
        started = time.perf_counter()
        yield
        self.record(stage, time.perf_counter() - started, **fields)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


_tracer = Tracer("", None)


def configure_tracing(role: str) -> Tracer:
    """At a daemon's start-up: traces to `$PRIME_TRACE/<role>-<pid>.jsonl` when the variable is set."""
    global _tracer
    folder = os.environ.get(TRACE_ENV_VAR)
    _tracer.close()
    _tracer = Tracer(role, Path(folder) / f"{role}-{os.getpid()}.jsonl" if folder else None)
    return _tracer


def record(stage: str, seconds: float, **fields: object) -> None:
    """`Tracer.record` on this process's tracer."""
    _tracer.record(stage, seconds, **fields)


@contextmanager
def span(stage: str, **fields: object) -> Iterator[None]:
    """`Tracer.span` on this process's tracer."""
    with _tracer.span(stage, **fields):
        yield


def read_trace(folder: Path) -> list[dict[str, object]]:
    """Every line of every trace file in `folder`, in no particular order (a torn last line is skipped)."""
    lines: list[dict[str, object]] = []
    for path in sorted(folder.glob("*.jsonl")):
        for text in path.read_text(encoding="utf-8").splitlines():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                continue
    return lines
