"""The coordinator protocol's schemas: what the trainer sends reads back the same, and hostile JSON from another
node (a wrong type, a bool for a number, a negative or oversize number, a missing key, extra nesting) is refused
with a `ProtocolError` that names the message and the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protocol.coordinator import (
    STATUS,
    AttestationBody,
    AttestationList,
    AttestationRecord,
    ErrorCode,
    PoolInfo,
    ProtocolError,
    PublishedStep,
    StepHistory,
    StepInfo,
    TaskGrant,
    Upload,
    routes,
)
from protocol.signing import AuthFailure

ADDRESS = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
KEY = bytes(range(32))
SIGNATURE = bytes(range(65))
ISSUED_AT = 1_700_000_000


def grant_json(**changes: Any) -> dict[str, Any]:
    grant = TaskGrant(4, ADDRESS, 3, 7, 8, 8, b"\x02" * 32, SIGNATURE, ISSUED_AT).to_json()
    return {k: v for k, v in (grant | changes).items() if v is not ...}


def test_each_message_reads_back_what_it_writes() -> None:
    messages = [
        PoolInfo(4, ADDRESS, 9),
        StepInfo(9),
        StepHistory((PublishedStep(0, 1000.0), PublishedStep(1, 1060.5))),
        TaskGrant(4, ADDRESS, 3, 7, 8, 8),
        TaskGrant(4, ADDRESS, 3, 7, 8, 8, b"\x02" * 32, SIGNATURE),
        TaskGrant(4, ADDRESS, 3, 7, 8, 8, b"\x02" * 32, SIGNATURE, ISSUED_AT),
        Upload(KEY, True, SIGNATURE),
        Upload(KEY, False),
        AttestationBody(KEY, False, 7, SIGNATURE),
        AttestationList(KEY, (AttestationRecord(KEY, True, 0, ADDRESS, SIGNATURE),)),
    ]
    for message in messages:
        wire = json.loads(json.dumps(message.to_json()))
        assert type(message).from_json(wire) == message


def test_the_wire_form_is_the_one_nodes_already_speak() -> None:
    """Byte for byte what the coordinator wrote before the schemas: same fields, same order, 0x hex."""
    assert json.dumps(TaskGrant(4, ADDRESS, 3, 7, 8, 8, b"\x02" * 32, SIGNATURE).to_json()) == json.dumps(
        {
            "pool_id": 4, "node": ADDRESS, "step": 3, "counter": 7, "prompts": 8, "group_size": 8,
            "task_spec_hash": "0x" + "02" * 32, "signature": "0x" + SIGNATURE.hex(),
        }
    )  # fmt: skip
    # issue 32: the signed issue time follows, where a coordinator sends one (docs/signed-messages.md)
    assert list(TaskGrant(4, ADDRESS, 3, 7, 8, 8, b"\x02" * 32, SIGNATURE, ISSUED_AT).to_json())[-1] == "issued_at"
    assert Upload(KEY, False).to_json() == {"work_key": "0x" + KEY.hex(), "created": False}
    record = AttestationRecord(KEY, True, 0, ADDRESS, SIGNATURE).to_json()
    assert list(record) == ["work_key", "accepted", "reason", "validator", "signature"]
    assert StepHistory((PublishedStep(2, 1130.25),)).to_json() == {"steps": [{"step": 2, "at": 1130.25}]}


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [
        ({"step": "3"}, "step", "must be an integer, got a string"),
        ({"step": True}, "step", "must be an integer, got a bool"),  # True is an int to Python, not to the protocol
        ({"step": 3.0}, "step", "must be an integer, got a number"),
        ({"counter": -1}, "counter", "must be 0 to"),
        ({"counter": 2**64}, "counter", "must be 0 to 18446744073709551615"),
        ({"pool_id": 10**4000}, "pool_id", "an integer of"),  # not printed whole
        ({"prompts": 0}, "prompts", "must be 1 to"),
        ({"group_size": 2**32}, "group_size", "must be 1 to 4294967295"),
        ({"node": ...}, "node", "is missing"),
        ({"node": {"address": ADDRESS}}, "node", "must be a string, got an object"),
        ({"node": [ADDRESS]}, "node", "must be a string, got a list"),
        ({"node": "0x1234"}, "node", "must be 0x and 40 hex digits"),
        ({"signature": "0x" + "ab" * 64}, "signature", "must be 0x and 130 hex digits"),
        ({"signature": "ab" * 65}, "signature", "must be 0x and 130 hex digits"),  # answers always carry the 0x
        ({"signature": "0x" + "zz" * 65}, "signature", "must be 0x and 130 hex digits"),
        ({"task_spec_hash": None}, "task_spec_hash", "must be a string, got null"),
        ({"issued_at": -1}, "issued_at", "must be 0 to"),
        ({"issued_at": 2**64}, "issued_at", "must be 0 to 18446744073709551615"),
        ({"issued_at": 1.7e9}, "issued_at", "must be an integer, got a number"),
        ({"issued_at": None}, "issued_at", "must be an integer, got null"),
    ],
)
def test_a_hostile_assignment_is_refused_naming_its_field(changes: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(ProtocolError, match="TaskGrant") as refused:
        TaskGrant.from_json(grant_json(**changes))
    assert refused.value.field == field and problem in refused.value.problem


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ([], "(message)"),
        ("steps", "(message)"),
        ({"steps": {"step": 1}}, "steps"),
        ({"steps": [[{"step": 1, "at": 1.0}]]}, "(message)"),  # nested one level too deep
        ({"steps": [{"step": 1, "at": float("nan")}]}, "at"),
        ({"steps": [{"step": 1, "at": float("inf")}]}, "at"),
        ({"steps": [{"step": 1, "at": -1}]}, "at"),
        ({"steps": [{"step": 1, "at": 2.0**41}]}, "at"),
        ({"steps": [{"step": 1, "at": False}]}, "at"),
        ({"steps": [{"step": 1}]}, "at"),
        ({"steps": [{"step": 1, "at": 1.0}] * 4097}, "steps"),
    ],
)
def test_a_hostile_step_history_is_refused(value: object, field: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        StepHistory.from_json(value)
    assert refused.value.field == field


def test_extra_keys_are_ignored_so_a_newer_peer_may_add_fields() -> None:
    assert StepInfo.from_json({"step": 3, "epoch": {"nested": [1, 2]}}) == StepInfo(3)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"accepted": "true"}, "accepted"),
        ({"accepted": 1}, "accepted"),
        ({"reason": 256}, "reason"),
        ({"reason": -1}, "reason"),
        ({"reason": True}, "reason"),
        ({"work_key": "0x" + "ab" * 33}, "work_key"),
        ({"work_key": 12}, "work_key"),
        ({"signature": "0x" + "ab" * 10_000}, "signature"),
        ({"signature": ...}, "signature"),
    ],
)
def test_a_hostile_attestation_post_is_refused(changes: dict[str, Any], field: str) -> None:
    body = AttestationBody(KEY, True, 0, SIGNATURE).to_json() | changes
    with pytest.raises(ProtocolError, match="AttestationBody") as refused:
        AttestationBody.from_json({k: v for k, v in body.items() if v is not ...})
    assert refused.value.field == field


def test_an_attestation_post_may_leave_out_the_0x_as_it_always_could() -> None:
    body = {"work_key": KEY.hex(), "accepted": True, "reason": 0, "signature": SIGNATURE.hex()}
    assert AttestationBody.from_json(body) == AttestationBody(KEY, True, 0, SIGNATURE)


def test_one_bad_entry_spoils_an_attestation_list() -> None:
    good = AttestationRecord(KEY, True, 0, ADDRESS, SIGNATURE).to_json()
    with pytest.raises(ProtocolError, match=r"AttestationRecord\.validator"):
        AttestationList.from_json({"work_key": "0x" + KEY.hex(), "attestations": [good, good | {"validator": 5}]})


def test_every_code_but_http_has_its_status_and_the_signature_codes_are_the_signing_modules() -> None:
    assert set(STATUS) == set(ErrorCode) - {ErrorCode.HTTP}
    assert {code.value for code in AuthFailure} <= {code.value for code in ErrorCode}
    assert (STATUS[ErrorCode.NO_WORK], STATUS[ErrorCode.QUOTA], STATUS[ErrorCode.LOST]) == (503, 429, 410)


def test_a_route_names_a_file_only_by_64_lower_case_hex_digits() -> None:
    assert routes.work_key_of(KEY.hex()) == KEY
    assert routes.rollout(KEY) == f"/v1/rollouts/{KEY.hex()}"
    for name in ("XYZ", KEY.hex().upper(), KEY.hex()[:-1], KEY.hex() + "0"):
        assert routes.work_key_of(name) is None
