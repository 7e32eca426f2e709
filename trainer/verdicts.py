"""The validators' verdicts the coordinator recorded, in memory for the step loop and journaled for restarts.

The attestation handler (`trainer/coordinator.py`) writes each verdict here once its signature is checked; the
step loop (`AttestedUploads` in `trainer/run.py`) asks which files it may train on. Both run in the trainer's
process, the loop in a worker thread, so the store takes a lock around each read and write.

The rule the loop trains by: a file is trainable once at least `min_accepts` distinct validators accepted it and
none rejected it. A rejection vetoes for good (a later acceptance, by the same validator or another, does not
lift it); the attestation list a node reads (`latest`) holds each validator's latest verdict.

What nodes read (`latest`, the signed records: about 1.4 KB a file with four validators) is kept for the
`max_files` files verdicts came on last (`MAX_FILES` by default, about 0.3 GB), so a pool's run does not grow by it
without end (33 files a second at 1,000 workers: 0.17 GB an hour). An older file's list then reads empty: a
validator that asks whether others accepted it verifies it itself, and a worker notes nothing; neither is a slash.
What the loop trains by (who accepted, who rejected) is kept for every file: some 0.2 KB a file, and a veto must
never be forgotten while a file could still be trained on (each validator's address is one string, interned).

The journal is `attestations.jsonl`: one `AttestationRecord` a line (sorted keys), appended as each verdict is
recorded and read once when the store opens, so a restarted trainer knows the verdicts posted before. A line cut
by a crash is skipped (its validator posts again), and the next record starts on a line of its own.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path

from core.safejson import loads_bounded
from protocol.coordinator.errors import ProtocolError
from protocol.coordinator.rollouts import AttestationRecord

log = logging.getLogger(__name__)

MAX_FILES = 200_000  # files whose signed verdicts `latest` serves: an hour of a 1,000-worker pool's files and more


class VerdictStore:
    """Verdicts by work key. `journal` None: kept in memory only (tests, benchmarks). `max_files`: files whose
    signed verdicts `latest` serves, those verdicts came on last (the module doc says why)."""

    def __init__(self, journal: Path | None = None, *, max_files: int = MAX_FILES) -> None:
        if max_files < 1:
            raise ValueError(f"max_files must be at least 1, got {max_files}")
        self.journal, self.max_files = journal, max_files
        self._lock = threading.Lock()
        self._latest: dict[bytes, dict[str, AttestationRecord]] = {}  # work key -> validator -> its latest verdict
        self._accepted_by: dict[bytes, set[str]] = {}  # work key -> validators that ever accepted it
        self._rejected: set[bytes] = set()  # work keys any validator ever rejected
        self._changes: list[bytes] = []  # the work key of each verdict, in the order they were recorded
        if journal is not None and journal.exists():
            skipped = 0
            for line in journal.read_bytes().splitlines():
                record = parse_journal_line(line)
                if record is None:
                    skipped += bool(line.strip())
                else:
                    self._take(record)
            if skipped:
                log.warning("%s: skipped %d lines that are not verdicts (cut by a crash?)", journal, skipped)

    def record(self, record: AttestationRecord) -> None:
        """Journals `record`, then makes it known to the readers."""
        if self.journal is not None:
            line = json.dumps(record.to_json(), sort_keys=True).encode() + b"\n"
            with self.journal.open("a+b") as out:
                if out.tell() and (out.seek(-1, 2), out.read(1))[1] != b"\n":  # a line cut by a crash stays alone
                    line = b"\n" + line
                out.write(line)
        with self._lock:
            self._take(record)

    def _take(self, record: AttestationRecord) -> None:
        key = record.work_key
        validator = sys.intern(record.validator)  # a handful of validators: one string each, not one a verdict
        latest = self._latest.pop(key, {})  # back in last: the files verdicts came on last are kept
        latest[validator] = record
        self._latest[key] = latest
        if len(self._latest) > self.max_files:
            del self._latest[next(iter(self._latest))]
        if record.accepted:
            self._accepted_by.setdefault(key, set()).add(validator)
        else:
            self._rejected.add(key)
        self._changes.append(key)

    def latest(self, work_key: bytes) -> list[AttestationRecord]:
        """Each validator's latest verdict on `work_key`, by validator address."""
        with self._lock:
            found = self._latest.get(work_key, {})
            return [found[validator] for validator in sorted(found)]

    def trainable(self, work_key: bytes, min_accepts: int) -> bool:
        """Accepted by at least `min_accepts` distinct validators and rejected by none."""
        with self._lock:
            return work_key not in self._rejected and len(self._accepted_by.get(work_key, ())) >= min_accepts

    def changed(self, since: int = 0) -> list[bytes]:
        """The work keys of the verdicts recorded from the `since`-th on (`since`: how many a reader has seen);
        a key comes once for each verdict on it."""
        with self._lock:
            return self._changes[since:]

    def __len__(self) -> int:
        with self._lock:
            return len(self._changes)


def parse_journal_line(line: bytes) -> AttestationRecord | None:
    """A line of the journal, or None for one that is not a whole record (cut by a crash, or edited by hand)."""
    try:
        return AttestationRecord.from_json(loads_bounded(line, 1))
    except (ValueError, ProtocolError):
        return None
