"""Which uploads the trainer may train on: every upload in local mode, attested ones in network mode."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trainer.inbox import RolloutInbox
from trainer.run import attested, every_upload

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
    assert names(attested(1)(inbox, log)) == {one, two}
    assert names(attested(2)(inbox, log)) == {two}  # V1 twice would not count as two validators
    attest(log, one, True, V1)
    assert names(attested(2)(inbox, log)) == {two}
    assert names(every_upload(inbox, log)) == {one, two, bad, silent}
    assert attested(1)(inbox, tmp_path / "missing.jsonl") == []
