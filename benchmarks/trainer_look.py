"""What one look for trainable files costs late in a long run: every upload of the run walked (the previous look)
against only the uploads still waiting (`trainer.run.EveryUpload` and `AttestedUploads`, given the consumed set).

Run: `.venv/bin/python benchmarks/trainer_look.py [--uploads 20000] [--waiting 8] [--repeats 20]`.

The step loop looks after every upload and every attestation, and every 0.5 s while it waits. The inbox holds
`--uploads` files named by their sha256 (a few bytes each: a look never reads a file it skips), every one accepted
by a validator in the verdict store, and all but `--waiting` already consumed by earlier steps. Both looks end
with the loop's own skip of consumed names (`TrainingLoop.select`), so each gives the same files to read.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from protocol.coordinator.rollouts import AttestationRecord
from trainer.inbox import RolloutInbox, named_work_key
from trainer.run import AttestedUploads, EveryUpload
from trainer.verdicts import VerdictStore

VALIDATOR = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"


def fill(root: Path, uploads: int) -> tuple[RolloutInbox, VerdictStore, list[bytes]]:
    inbox_dir = root / "inbox"
    inbox_dir.mkdir()
    keys = []
    verdicts = VerdictStore(root / "attestations.jsonl")
    for i in range(uploads):
        data = i.to_bytes(8, "big")
        key = hashlib.sha256(data).digest()
        (inbox_dir / f"{key.hex()}.parquet").write_bytes(data)
        verdicts.record(AttestationRecord(key, True, 0, VALIDATOR, bytes(65)))
        keys.append(key)
    return RolloutInbox(inbox_dir), verdicts, keys


def median_ms(look: Callable[[], list[Path]], repeats: int) -> tuple[float, int]:
    times, found = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        found = len(look())
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uploads", type=int, default=20_000)
    parser.add_argument("--waiting", type=int, default=8, help="uploads no step has consumed yet")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        inbox, verdicts, keys = fill(Path(tmp), args.uploads)
        consumed = set(keys[: args.uploads - args.waiting])
        unconsumed = lambda paths: [p for p in paths if named_work_key(p) not in consumed]  # noqa: E731  (select)

        attested = AttestedUploads(1)
        attested(inbox, verdicts, set())  # every verdict taken in once, as a running trainer has
        ready = set(keys)

        def previous_local() -> list[Path]:
            return unconsumed([inbox.path(k) for k in inbox.uploads()])

        def previous_network() -> list[Path]:
            return unconsumed([inbox.path(k) for k in ready if inbox.has(k)])

        every = EveryUpload()
        looks = {
            "local": (previous_local, lambda: unconsumed(every(inbox, verdicts, consumed))),
            "network": (previous_network, lambda: unconsumed(attested(inbox, verdicts, consumed))),
        }
        print(f"{args.uploads} uploads, {args.waiting} not yet consumed; median of {args.repeats} looks")
        print(f"{'mode':10}{'every upload (ms)':>20}{'waiting only (ms)':>20}{'ratio':>10}")
        for mode, (previous, current) in looks.items():
            current()  # the first look after a start takes in every arrival once
            old_ms, old_found = median_ms(previous, args.repeats)
            new_ms, new_found = median_ms(current, args.repeats)
            if old_found != new_found:
                raise SystemExit(f"{mode}: the looks disagree ({old_found} against {new_found} files)")
            print(f"{mode:10}{old_ms:20.2f}{new_ms:20.3f}{old_ms / new_ms:9.0f}x")


if __name__ == "__main__":
    main()
