"""The pool's files in flight: assignments that may still become a file the trainer trains on.

An assignment is in flight from the moment it is handed out until its file is trained on, a validator vetoes the
file, or its step leaves the trainer's window (the file could only be dropped as stale). The coordinator hands out
no more than `limit` at once (`[coordinator] max_files_in_flight`): by default the files the k + 1 steps of the
window train on. With the oldest files trained first (`[data] order`), a file handed out under that bound is
trained on before it leaves the window, as long as it arrives: the pool generates while the trainer trains, up to
k steps ahead, and never a file that can only go stale. Before it, each node got its step's files plus half (the
per-node cap, which stays), and a network of one honest worker let 42 of 150 files go stale in 3 minutes
(benchmarks/network_learning.py; docs/trainer.md).

A restarted coordinator starts with nothing in flight: at most one window's files more are handed out, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Assignment = tuple[str, int]  # (node, counter)


@dataclass
class FilesInFlight:
    """Assignments handed out and not yet settled, by the step they were handed out at."""

    async_level: int
    _steps: dict[Assignment, int] = field(default_factory=dict)  # in flight -> its step
    _keys: dict[bytes, Assignment] = field(default_factory=dict)  # an uploaded file -> its assignment

    def issued(self, node: str, counter: int, step: int) -> None:
        self._steps[(node, counter)] = step

    def uploaded(self, work_key: bytes, node: str, counter: int) -> None:
        """A stored file of assignment (node, counter): a veto of its key settles the assignment."""
        if (node, counter) in self._steps:
            self._keys[work_key] = (node, counter)

    def settle(self, assignments: list[Assignment]) -> None:
        """Trained on (or consumed as stale): no longer in flight."""
        for assignment in assignments:
            self._steps.pop(assignment, None)
        self._forget_keys()

    def vetoed(self, work_key: bytes) -> None:
        """A validator rejected the file: nobody will train on it."""
        assignment = self._keys.pop(work_key, None)
        if assignment is not None:
            self._steps.pop(assignment, None)

    def count(self, step: int) -> int:
        """In flight while the trainer is at policy step `step`; drops what its window has left behind."""
        oldest = step - self.async_level
        gone = [assignment for assignment, at in self._steps.items() if at < oldest]
        if gone:
            for assignment in gone:
                del self._steps[assignment]
            self._forget_keys()
        return len(self._steps)

    def _forget_keys(self) -> None:
        if len(self._keys) > len(self._steps):
            self._keys = {key: a for key, a in self._keys.items() if a in self._steps}
