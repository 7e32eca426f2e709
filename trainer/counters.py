"""Assignment counters, journaled: one appended line per assignment, made durable before the assignment is answered.

A counter handed out must never be handed out again, even after a crash: a second assignment of one (node,
counter) at another step is a second signed assignment of the same work, and the trainer trains on only one file
of an assignment (trainer/loop.py), so an honest worker's second file would be refused. The coordinator
therefore persists each counter before it answers.

Rewriting the whole table (`counters.json`, a line per member) and fsyncing it on the event loop for every
assignment was 30% of the coordinator's samples at 1,000 members (benchmarks/scale.py). Here an assignment costs a
line appended to a list; one flush in a worker thread writes every line waiting and fsyncs once (group commit),
and each `record` returns once a flush that holds its line has reached the disk. Requests that arrive while a
flush runs wait for the next, so at most two fsyncs are ever in a request's way, however many members ask.

The file holds `<node> <next counter>` lines; the largest value per node wins. Opening it reads it back, skips a
torn last line (a crash mid-append: that assignment was never answered), and compacts it to one line per node
(written to a sibling, fsynced and renamed: a crash leaves the old file or the new). It is compacted again, in
the flushing thread, once it holds `compact_after` lines more than nodes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

from protocol.rollouts.writer import publish_atomically
from trainer.errors import TrainerError

COMPACT_AFTER = 100_000  # lines past one per node before the file is rewritten: about 5 MB, an hour of 1,000 nodes


class CounterJournalError(TrainerError):
    """The journal holds a complete line that is not `<node> <counter>`: not a torn append, so not skipped."""

    def __init__(self, path: Path, line_number: int, line: bytes) -> None:
        super().__init__(f"{path}, line {line_number}: {line[:100]!r} is not '<node> <counter>'; refusing to guess")
        self.path, self.line_number = path, line_number


def read_counters(path: Path) -> dict[str, int]:
    """The next counter per node in the journal at `path` ({} if there is none); a torn last line is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: b"" or a torn append, never a line that was made durable whole
    counters: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        node, counter = _parse(line)
        if node is None or counter is None:
            raise CounterJournalError(path, number, line)
        counters[node] = max(counters.get(node, 0), counter)
    return counters


def _parse(line: bytes) -> tuple[str | None, int | None]:
    fields = line.split(b" ")
    if len(fields) != 2 or not fields[0] or not fields[1].isdigit():
        return None, None
    try:
        return fields[0].decode("ascii"), int(fields[1])
    except UnicodeDecodeError:
        return None, None


def _encode(counters: Mapping[str, int]) -> bytes:
    return "".join(f"{node} {counter}\n" for node, counter in sorted(counters.items())).encode("ascii")


class CounterJournal:
    """The next assignment counter per node, persisted; `record` on the event loop, `close` when done."""

    def __init__(self, path: Path, counters: dict[str, int], *, compact_after: int) -> None:
        """Use `open`, which reads and compacts the file first."""
        self.path, self.compact_after = path, compact_after
        self._counters = counters
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lines = len(counters)  # lines in the file
        self._pending: list[str] = []  # lines recorded, not yet handed to a flush
        self._recorded = 0  # lines ever recorded; `_durable` of them are on disk
        self._durable = 0
        self._flushing: asyncio.Future[None] | None = None

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], floor: Mapping[str, int] | None = None, *, compact_after: int = COMPACT_AFTER
    ) -> CounterJournal:
        """The journal at `path`, each node's counter at least `floor`'s (a saved state's, an older file's),
        rewritten to one line per node. Blocks on the disk: call it before serving."""
        path = Path(path)
        counters = read_counters(path)
        for node, counter in (floor or {}).items():
            counters[node] = max(counters.get(node, 0), counter)
        publish_atomically(path, _encode(counters))
        return cls(path, counters, compact_after=compact_after)

    @property
    def counters(self) -> Mapping[str, int]:
        """The next counter per node: every value recorded, durable or being made so."""
        return self._counters

    async def record(self, node: str, next_counter: int) -> None:
        """`node`'s next counter is `next_counter`; returns once that is on disk (raises OSError if it cannot be)."""
        if not node or any(c.isspace() for c in node) or next_counter < 0:
            raise ValueError(
                f"a counter is a node without spaces and a count of at least 0, got {node!r} {next_counter}"
            )
        self._counters[node] = max(self._counters.get(node, 0), next_counter)
        self._pending.append(f"{node} {next_counter}\n")
        self._recorded += 1
        mine = self._recorded
        while self._durable < mine:
            if self._flushing is None:
                self._flushing = asyncio.ensure_future(self._flush())
            await asyncio.shield(self._flushing)  # a cancelled request leaves the flush to the others

    async def _flush(self) -> None:
        """Writes and fsyncs every line waiting, in a worker thread; compacts instead when the file is long."""
        batch, self._pending = self._pending, []
        upto = self._recorded
        snapshot = dict(self._counters) if self._lines + len(batch) > len(self._counters) + self.compact_after else None
        try:
            await asyncio.to_thread(self._write, "".join(batch).encode("ascii"), snapshot)
        finally:
            self._flushing = None
        self._durable = upto
        self._lines = len(snapshot) if snapshot is not None else self._lines + len(batch)

    def _write(self, lines: bytes, snapshot: dict[str, int] | None) -> None:
        """In the flushing thread, the only one that touches the file while serving. The snapshot holds the batch."""
        if snapshot is not None:
            publish_atomically(self.path, _encode(snapshot))
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            return
        view = memoryview(lines)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)

    async def close(self) -> None:
        """Waits for the flush under way, then closes the file."""
        if self._flushing is not None:
            await asyncio.shield(self._flushing)
        os.close(self._fd)
