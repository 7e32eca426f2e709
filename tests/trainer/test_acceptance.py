"""Which uploads the trainer may train on: every upload in local mode, attested ones in network mode."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trainer.inbox import RolloutInbox
from trainer.run import AttestedUploads, EveryUpload

V1 = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
V2 = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"


def put(inbox: RolloutInbox, data: bytes) -> str:
    key = hashlib.sha256(data).digest()
    inbox.put(key, data, "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1")
    return "0x" + key.hex()


def attest(log: Path, key: str, accepted: bool, validator: str) -> None:
    with log.open("a") as out:
        out.write(json.dumps({"work_key": key, "accepted": accepted, "reason": "", "validator": validator}) + "\n")


def test_network_mode_trains_only_on_files_enough_validators_accepted_and_none_rejected(tmp_path: Path) -> None:
    inbox = RolloutInbox(tmp_path / "inbox")
    log = tmp_path / "attestations.jsonl"
    one, two, bad, silent = (put(inbox, bytes([i]) * 10) for i in range(4))
    attest(log, one, True, V1)
    attest(log, two, True, V1)
    attest(log, two, True, V2)
    attest(log, bad, True, V1)
    attest(log, bad, False, V2)
    attest(log, "0x" + "ab" * 32, True, V1)  # attested but never uploaded
    with log.open("a") as out:
        out.write('{"work_key": "0x')  # a line cut by a crash
    names = lambda paths: {"0x" + p.stem for p in paths}  # noqa: E731
    assert names(AttestedUploads(1)(inbox, log, set())) == {one, two}
    assert names(AttestedUploads(2)(inbox, log, set())) == {two}  # V1 twice would not count as two validators
    attest(log, one, True, V1)
    assert names(AttestedUploads(2)(inbox, log, set())) == {two}
    assert names(EveryUpload()(inbox, log, set())) == {one, two, bad, silent}
    assert AttestedUploads(1)(inbox, tmp_path / "missing.jsonl", set()) == []


def test_the_attestation_log_is_read_once_as_it_grows(tmp_path: Path) -> None:
    inbox = RolloutInbox(tmp_path / "inbox")
    log = tmp_path / "attestations.jsonl"
    one, two, three = (put(inbox, bytes([i]) * 10) for i in range(3))
    accepted = AttestedUploads(2)
    names = lambda: {"0x" + p.stem for p in accepted(inbox, log, set())}  # noqa: E731
    assert names() == set()  # no log yet
    attest(log, one, True, V1)
    attest(log, one, True, V2)
    assert names() == {one}
    with log.open("a") as out:  # a validator's record half written: not read until its line ends
        out.write(json.dumps({"work_key": two, "accepted": True, "reason": "", "validator": V1})[:30])
    assert names() == {one}
    with log.open("a") as out:
        out.write(json.dumps({"work_key": two, "accepted": True, "reason": "", "validator": V1})[30:] + "\n")
    attest(log, two, True, V2)
    assert names() == {one, two}
    attest(log, one, False, V1)  # a rejection after the acceptances still withdraws the file
    attest(log, three, True, V1)
    attest(log, three, True, V2)
    assert names() == {two, three}
    # the parsed part of the log is not read again: a line changed in place there is not seen
    text = log.read_text()
    log.write_text(text.replace('"accepted": false', '"accepted": true '))
    assert names() == {two, three}
    log.write_text("")  # a log that shrank is read again from its start
    attest(log, three, True, V1)
    assert names() == set()
    attest(log, three, True, V2)
    assert names() == {three}


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
    log = tmp_path / "attestations.jsonl"
    keys = [put(inbox, bytes([i]) * 10) for i in range(40)]
    for key in keys:
        attest(log, key, True, V1)
    consumed = {bytes.fromhex(k[2:]) for k in keys[:38]}  # trained on, or dropped as stale
    names = lambda paths: sorted("0x" + p.stem for p in paths)  # noqa: E731
    for uploads in (EveryUpload(), AttestedUploads(1)):
        assert len(uploads(inbox, log, set())) == 40
        inbox.checked = 0
        assert names(uploads(inbox, log, consumed)) == sorted(keys[38:])
        assert inbox.checked == 2  # the waiting files only, not every upload of the run
        assert names(uploads(inbox, log, set())) == sorted(keys[38:])  # consumed once: left out for good
    attest(log, keys[0], True, V2)  # a late second acceptance of a consumed file does not bring it back
    later = put(inbox, b"later")
    attest(log, later, True, V1)
    every, attested = EveryUpload(), AttestedUploads(1)
    for uploads in (every, attested):  # as after a restart: the consumed set comes from the saved state
        assert names(uploads(inbox, log, consumed)) == sorted([*keys[38:], later])
    reopened = RolloutInbox(tmp_path / "inbox")
    assert names(EveryUpload()(reopened, log, consumed)) == sorted([*keys[38:], later])
