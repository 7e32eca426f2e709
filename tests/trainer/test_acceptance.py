"""Which uploads the trainer may train on: every upload in local mode, attested ones in network mode."""

from __future__ import annotations

import hashlib
from pathlib import Path

from protocol.coordinator.rollouts import AttestationRecord
from trainer.inbox import RolloutInbox
from trainer.run import AttestedUploads, EveryUpload
from trainer.verdicts import VerdictStore

V1 = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
V2 = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"


def put(inbox: RolloutInbox, data: bytes) -> str:
    key = hashlib.sha256(data).digest()
    inbox.put(key, data, "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1")
    return "0x" + key.hex()


def attest(verdicts: VerdictStore, key: str, accepted: bool, validator: str) -> None:
    """A verdict as the API records it once its signature is checked (the store does not check it again)."""
    verdicts.record(AttestationRecord(bytes.fromhex(key[2:]), accepted, 0 if accepted else 7, validator, bytes(65)))


def test_network_mode_trains_only_on_files_enough_validators_accepted_and_none_rejected(tmp_path: Path) -> None:
    inbox = RolloutInbox(tmp_path / "inbox")
    verdicts = VerdictStore(tmp_path / "attestations.jsonl")
    one, two, bad, silent = (put(inbox, bytes([i]) * 10) for i in range(4))
    attest(verdicts, one, True, V1)
    attest(verdicts, two, True, V1)
    attest(verdicts, two, True, V2)
    attest(verdicts, bad, True, V1)
    attest(verdicts, bad, False, V2)
    attest(verdicts, "0x" + "ab" * 32, True, V1)  # attested but never uploaded
    names = lambda paths: {"0x" + p.stem for p in paths}  # noqa: E731
    assert names(AttestedUploads(1)(inbox, verdicts, set())) == {one, two}
    assert names(AttestedUploads(2)(inbox, verdicts, set())) == {two}  # V1 twice would not count as two validators
    attest(verdicts, one, True, V1)
    assert names(AttestedUploads(2)(inbox, verdicts, set())) == {two}
    assert names(EveryUpload()(inbox, verdicts, set())) == {one, two, bad, silent}
    assert AttestedUploads(1)(inbox, VerdictStore(), set()) == []


def test_a_look_takes_in_only_the_verdicts_recorded_since_the_last(tmp_path: Path) -> None:
    inbox = RolloutInbox(tmp_path / "inbox")
    verdicts = VerdictStore(tmp_path / "attestations.jsonl")
    one, two, three = (put(inbox, bytes([i]) * 10) for i in range(3))
    accepted = AttestedUploads(2)
    names = lambda: {"0x" + p.stem for p in accepted(inbox, verdicts, set())}  # noqa: E731
    assert names() == set()  # no verdict yet
    attest(verdicts, one, True, V1)
    attest(verdicts, one, True, V2)
    assert names() == {one}
    assert accepted._seen == 2
    attest(verdicts, two, True, V1)
    attest(verdicts, two, True, V2)
    assert names() == {one, two} and accepted._seen == 4
    attest(verdicts, one, False, V1)  # a rejection after the acceptances still withdraws the file
    attest(verdicts, three, True, V1)
    attest(verdicts, three, True, V2)
    assert names() == {two, three}


def test_a_restarted_trainer_trains_on_what_was_accepted_before_it_stopped(tmp_path: Path) -> None:
    inbox = RolloutInbox(tmp_path / "inbox")
    journal = tmp_path / "attestations.jsonl"
    one, two = (put(inbox, bytes([i]) * 10) for i in range(2))
    before = VerdictStore(journal)
    attest(before, one, True, V1)
    attest(before, two, True, V1)
    attest(before, two, False, V2)
    with journal.open("ab") as out:
        out.write(b'{"work_key": "0x')  # a crash in the middle of the next record
    names = lambda paths: {"0x" + p.stem for p in paths}  # noqa: E731
    after = VerdictStore(journal)
    assert names(AttestedUploads(1)(inbox, after, set())) == {one}  # two's rejection survived the restart too


def test_the_inbox_lists_its_uploads_from_memory_after_one_scan(tmp_path: Path) -> None:
    inbox = RolloutInbox(tmp_path / "inbox")
    first = put(inbox, b"first")
    (tmp_path / "inbox" / "notes.parquet").write_bytes(b"not an upload")  # not named by a hash: never listed
    reopened = RolloutInbox(tmp_path / "inbox")
    assert ["0x" + k.hex() for k in reopened.uploads()] == [first]
    second = put(reopened, b"second")
    assert sorted("0x" + k.hex() for k in reopened.uploads()) == sorted([first, second])
    assert not reopened.put(bytes.fromhex(second[2:]), b"second", "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1")


class CountingInbox(RolloutInbox):
    """A real inbox that counts how often a look asks whether a file is on disk."""

    checked = 0

    def has(self, work_key: bytes) -> bool:
        self.checked += 1
        return super().has(work_key)


def test_a_look_leaves_out_consumed_uploads_for_good_and_walks_only_those_waiting(tmp_path: Path) -> None:
    inbox = CountingInbox(tmp_path / "inbox")
    verdicts = VerdictStore()
    keys = [put(inbox, bytes([i]) * 10) for i in range(40)]
    for key in keys:
        attest(verdicts, key, True, V1)
    consumed = {bytes.fromhex(k[2:]) for k in keys[:38]}  # trained on, or dropped as stale
    names = lambda paths: sorted("0x" + p.stem for p in paths)  # noqa: E731
    for uploads in (EveryUpload(), AttestedUploads(1)):
        assert len(uploads(inbox, verdicts, set())) == 40
        inbox.checked = 0
        assert names(uploads(inbox, verdicts, consumed)) == sorted(keys[38:])
        assert inbox.checked == 2  # the waiting files only, not every upload of the run
        assert names(uploads(inbox, verdicts, set())) == sorted(keys[38:])  # consumed once: left out for good
    attest(verdicts, keys[0], True, V2)  # a late second acceptance of a consumed file does not bring it back
    later = put(inbox, b"later")
    attest(verdicts, later, True, V1)
    every, attested = EveryUpload(), AttestedUploads(1)
    for uploads in (every, attested):  # as after a restart: the consumed set comes from the saved state
        assert names(uploads(inbox, verdicts, consumed)) == sorted([*keys[38:], later])
    reopened = RolloutInbox(tmp_path / "inbox")
    assert names(EveryUpload()(reopened, verdicts, consumed)) == sorted([*keys[38:], later])
