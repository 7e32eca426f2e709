"""trainer/counters.py: assignment counters journaled, durable before answering, read back after a crash."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from trainer.counters import CounterJournal, CounterJournalError, read_counters


def test_recorded_counters_are_read_back_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "counters.jsonl"

    async def run() -> None:
        journal = CounterJournal.open(path)
        await asyncio.gather(*(journal.record(f"0xnode{i % 3}", i + 1) for i in range(30)))
        await journal.close()

    asyncio.run(run())
    assert read_counters(path) == {"0xnode0": 28, "0xnode1": 29, "0xnode2": 30}
    assert CounterJournal.open(path).counters == {"0xnode0": 28, "0xnode1": 29, "0xnode2": 30}


def test_a_batch_of_concurrent_records_shares_few_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    journal = CounterJournal.open(tmp_path / "c")
    synced.clear()

    async def run() -> None:
        await asyncio.gather(*(journal.record(f"0xnode{i}", 1) for i in range(200)))
        await journal.close()

    asyncio.run(run())
    assert 1 <= len(synced) <= 2  # the first line's flush, then one for the 199 that waited for it
    assert len(read_counters(tmp_path / "c")) == 200


def test_a_torn_last_line_is_skipped_and_compacted_away(tmp_path: Path) -> None:
    path = tmp_path / "c"
    path.write_bytes(b"0xa 3\n0xb 1\n0xa 5\n0xb 9")  # the crash tore the last append: never answered
    assert read_counters(path) == {"0xa": 5, "0xb": 1}
    journal = CounterJournal.open(path)
    assert journal.counters == {"0xa": 5, "0xb": 1}
    assert path.read_bytes() == b"0xa 5\n0xb 1\n"  # compacted: one line per node


def test_a_complete_line_that_is_garbage_is_refused_not_skipped(tmp_path: Path) -> None:
    path = tmp_path / "c"
    path.write_bytes(b"0xa 3\nnot a counter\n0xa 4\n")
    with pytest.raises(CounterJournalError, match="line 2"):
        read_counters(path)


def test_open_keeps_the_larger_of_the_file_and_the_floor(tmp_path: Path) -> None:
    path = tmp_path / "c"
    path.write_bytes(b"0xa 3\n0xb 7\n")
    journal = CounterJournal.open(path, {"0xa": 5, "0xb": 2, "0xc": 1})
    assert journal.counters == {"0xa": 5, "0xb": 7, "0xc": 1}
    assert read_counters(path) == {"0xa": 5, "0xb": 7, "0xc": 1}


def test_a_long_journal_is_compacted_while_serving(tmp_path: Path) -> None:
    path = tmp_path / "c"

    async def run() -> None:
        journal = CounterJournal.open(path, compact_after=10)
        for i in range(50):
            await journal.record("0xa", i + 1)
            await journal.record("0xb", 100 + i)
        await journal.close()

    asyncio.run(run())
    assert len(path.read_bytes().splitlines()) <= 2 + 10 + 1
    assert read_counters(path) == {"0xa": 50, "0xb": 149}


def test_a_counter_never_goes_back(tmp_path: Path) -> None:
    async def run() -> CounterJournal:
        journal = CounterJournal.open(tmp_path / "c")
        await journal.record("0xa", 9)
        await journal.record("0xa", 4)
        await journal.close()
        return journal

    assert asyncio.run(run()).counters == {"0xa": 9}
    assert read_counters(tmp_path / "c") == {"0xa": 9}


def test_a_node_with_a_space_is_refused(tmp_path: Path) -> None:
    journal = CounterJournal.open(tmp_path / "c")
    with pytest.raises(ValueError, match="without spaces"):
        asyncio.run(journal.record("0xa 1", 2))
