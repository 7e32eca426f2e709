"""The trainer's verdict store: what the attestation handler records, the step loop reads in the same process,
and a restarted trainer reads back from its journal."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from protocol.coordinator.rollouts import AttestationRecord
from trainer.verdicts import VerdictStore

V1, V2, V3 = (f"0x{i:040x}" for i in (1, 2, 3))
ONE, TWO = b"\x01" * 32, b"\x02" * 32


def verdict(key: bytes, validator: str, accepted: bool = True, reason: int = 0) -> AttestationRecord:
    return AttestationRecord(key, accepted, reason, validator, bytes([len(validator)]) * 65)


def test_a_file_is_trainable_once_enough_distinct_validators_accepted_it() -> None:
    store = VerdictStore()
    store.record(verdict(ONE, V1))
    store.record(verdict(ONE, V1))  # the same validator twice counts once
    assert store.trainable(ONE, 1) and not store.trainable(ONE, 2)
    store.record(verdict(ONE, V2))
    assert store.trainable(ONE, 2) and not store.trainable(ONE, 3)
    assert not store.trainable(TWO, 1)  # nobody judged it


def test_one_rejection_vetoes_for_good() -> None:
    store = VerdictStore()
    for validator in (V1, V2):
        store.record(verdict(ONE, validator))
    store.record(verdict(ONE, V3, accepted=False, reason=7))
    assert not store.trainable(ONE, 1)
    store.record(verdict(ONE, V3))  # the rejecting validator changing its mind does not lift the veto
    assert not store.trainable(ONE, 1)
    assert [(r.validator, r.accepted) for r in store.latest(ONE)] == [(V1, True), (V2, True), (V3, True)]


def test_a_reader_takes_only_the_verdicts_recorded_since_its_last_look() -> None:
    store = VerdictStore()
    store.record(verdict(ONE, V1))
    store.record(verdict(TWO, V1))
    assert store.changed() == [ONE, TWO] and len(store) == 2
    store.record(verdict(ONE, V2))
    assert store.changed(2) == [ONE]
    assert store.changed(3) == []


def test_the_verdicts_survive_a_restart_and_a_line_cut_by_a_crash(tmp_path: Path) -> None:
    journal = tmp_path / "attestations.jsonl"
    store = VerdictStore(journal)
    store.record(verdict(ONE, V1))
    store.record(verdict(TWO, V1))
    store.record(verdict(TWO, V2, accepted=False, reason=7))
    with journal.open("ab") as out:
        out.write(b'{"work_key": "0x42')  # the crash
    restarted = VerdictStore(journal)
    assert restarted.trainable(ONE, 1) and not restarted.trainable(TWO, 1)
    assert restarted.latest(TWO) == store.latest(TWO)
    assert restarted.changed() == [ONE, TWO, TWO]
    restarted.record(verdict(ONE, V2))
    lines = journal.read_bytes().splitlines()
    assert lines[3] == b'{"work_key": "0x42'  # the cut line stays on its own; the next record starts a line
    assert json.loads(lines[4])["validator"] == V2
    assert VerdictStore(journal).trainable(ONE, 2)


def test_the_journal_holds_the_records_the_api_wrote_before(tmp_path: Path) -> None:
    """One sorted-keys JSON line a verdict, as `trainer/api.py` wrote them: a journal of an older run still loads."""
    journal = tmp_path / "attestations.jsonl"
    VerdictStore(journal).record(verdict(ONE, V1, accepted=False, reason=7))
    (line,) = journal.read_text().splitlines()
    assert line == json.dumps(verdict(ONE, V1, accepted=False, reason=7).to_json(), sort_keys=True)
    older = tmp_path / "older.jsonl"
    older.write_text(line + "\n" + '{"work_key": "0x01", "accepted": true}\n')  # a record missing fields is skipped
    assert VerdictStore(older).latest(ONE) == [verdict(ONE, V1, accepted=False, reason=7)]


def test_the_loop_can_read_while_the_handler_records() -> None:
    store = VerdictStore()
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                for key in store.changed():
                    store.trainable(key, 2)
                store.latest(ONE)
        except Exception as exc:  # reported below
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(3000):
        store.record(verdict(bytes([i % 256]) * 32, f"0x{i % 7:040x}", accepted=i % 11 != 0))
    stop.set()
    reader.join()
    assert errors == [] and len(store) == 3000


def test_signed_verdicts_are_kept_for_at_most_max_files_files_and_vetoes_for_every_file() -> None:
    store = VerdictStore(max_files=100)
    keys = [i.to_bytes(32, "big") for i in range(1000)]
    store.record(verdict(keys[0], V1, accepted=False, reason=7))
    for key in keys:
        store.record(verdict(key, V1))
        store.record(verdict(key, V2))
    assert len(store._latest) == 100  # the cap, after 1,000 distinct files
    assert store.latest(keys[0]) == [] and store.latest(keys[899]) == []  # the oldest files read empty
    assert [r.validator for r in store.latest(keys[900])] == [V1, V2]
    assert store.trainable(keys[1], 2)  # what the loop trains by is kept for every file ...
    assert not store.trainable(keys[0], 1)  # ... and a veto with it
    store.record(verdict(keys[5], V3))  # a verdict on an old file brings its list back, newest
    assert [r.validator for r in store.latest(keys[5])] == [V3] and len(store._latest) == 100
