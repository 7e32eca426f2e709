"""Our EIP-712 messages against a second implementation, ethers.js (tests/interop/ethers/typed.mjs).

Every off-chain signed message type (docs/signed-messages.md), with values at the edges of its field types: ethers
computes the same digest, recovers our signer from our signature, and signs the same 65 bytes (both sign with
RFC 6979 nonces and low s), which we recover. Then a request that ethers signs and Node's HTTP client sends is
served by the coordinator on a real aiohttp server, and one for another pool or by a stranger is refused; the
assignment it answers is rebuilt by ethers from the answer's JSON with types of its own (issue time included) and
recovers the trainer. The documented type strings are the ones the code signs. Without Node.js these skip, and fail
instead under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from p2p.messages import RelayAdvert, ValidatorHeartbeat
from protocol.signing import (
    Assignment,
    Attestation,
    BatchReceipt,
    Checkpoint,
    Request,
    SigningDomain,
    TypedMessage,
    UntimedAssignment,
    UploadReceipt,
    digest,
    recover,
    sign,
)
from tests.loopback_coordinator import coordinator_service, serving
from tests.node_js import node_json, node_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # the first test may run `npm ci` (about 5 s)

JS_DIR = Path(__file__).parent / "ethers"
DOCS = Path(__file__).parents[2] / "docs" / "signed-messages.md"
DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
SIGNER: LocalAccount = Account.from_key(b"\x21" * 32)
OTHER: LocalAccount = Account.from_key(b"\x22" * 32)
U64, U256 = 2**64 - 1, 2**256 - 1

MESSAGES: dict[str, TypedMessage] = {
    "request, every field at its widest": Request(
        SIGNER.address,
        "PUT",
        "/v1/rollouts/" + "ab" * 32 + "?x=1&y=ü%20",
        bytes(range(32)),
        U64,
        b"\xff" * 16,
        U256,
        "[::1]:8600",
    ),
    "request, zeros": Request(SIGNER.address, "GET", "/", bytes(32), 0, bytes(16), 0, "a"),
    "checkpoint": Checkpoint(pool_id=7, step=U64, manifest_hash=b"\x03" * 32),
    "attestation, accepted": Attestation(pool_id=U256, work_key=b"\x04" * 32, accepted=True, reason=0),
    "attestation, refused": Attestation(pool_id=0, work_key=b"\x05" * 32, accepted=False, reason=255),
    "assignment, issued at 0": Assignment(2**255, OTHER.address, U64, 2**63, 2**32 - 1, 1, bytes(range(32, 64)), 0),
    "assignment, issued at the last uint64 second": Assignment(0, OTHER.address, 0, 0, 1, 2**32 - 1, bytes(32), U64),
    "assignment, issued now": Assignment(3, OTHER.address, 41, 7, 8, 8, b"\x07" * 32, 1_764_000_000),
    "assignment of rollout format 2, untimed": UntimedAssignment(
        2**255, OTHER.address, U64, 2**63, 2**32 - 1, 1, bytes(range(32, 64))
    ),
    "upload receipt": UploadReceipt(pool_id=3, work_key=b"\x06" * 32, node=OTHER.address),
    "batch receipt": BatchReceipt(pool_id=U256, root=b"\x08" * 32, node=OTHER.address, count=4096),
    "relay advert": RelayAdvert(pool_id=1, url="https://relay.example:8700/a?b=c#d", throughput_kbps=U64, timestamp=1),
    "validator heartbeat": ValidatorHeartbeat(pool_id=2, timestamp=1_700_000_000, next_block=U64, backlog=0),
}


@pytest.fixture(scope="module")
def typed_js() -> list[str]:
    return node_script(JS_DIR, "typed.mjs")


def _json_value(value: Any) -> Any:
    """A message value as ethers takes it from JSON: uints as decimal strings (past 2**53), bytes as 0x-hex."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, bytes):
        return "0x" + value.hex()
    raise TypeError(f"no JSON form for {value!r}")


def _case(message: TypedMessage, account: LocalAccount) -> dict[str, Any]:
    typed = message.typed_data(DOMAIN)
    types = {name: fields for name, fields in typed["types"].items() if name != "EIP712Domain"}
    return {
        "domain": typed["domain"],
        "types": types,
        "primaryType": typed["primaryType"],
        "message": {name: _json_value(value) for name, value in typed["message"].items()},
        "signature": "0x" + sign(message, account, DOMAIN).hex(),
        "key": "0x" + account.key.hex(),
    }


def test_ethers_computes_our_digests_recovers_our_signers_and_signs_the_same_bytes(typed_js: list[str]) -> None:
    cases = [_case(message, SIGNER) for message in MESSAGES.values()]
    answers = asyncio.run(node_json([*typed_js, "check"], json.dumps(cases).encode()))
    assert len(answers) == len(MESSAGES)
    for (name, message), answer in zip(MESSAGES.items(), answers, strict=True):
        assert "error" not in answer, f"{name}: ethers refused it: {answer['error']}"
        assert answer["hash"] == "0x" + digest(message, DOMAIN).hex(), name
        assert answer["recovered"] == SIGNER.address, name
        theirs = bytes.fromhex(answer["signature"][2:])
        assert recover(message, theirs, DOMAIN) == SIGNER.address, name
        assert theirs == sign(message, SIGNER, DOMAIN), f"{name}: same key, same digest, RFC 6979: same signature"


@pytest.mark.parametrize(
    ("message", "field", "altered"),
    [("checkpoint", "step", str(U64 - 1)), ("assignment, issued now", "issuedAt", str(1_764_000_001))],
)
def test_a_field_ethers_reads_differently_gives_another_digest(
    typed_js: list[str], message: str, field: str, altered: str
) -> None:
    """The comparison above can fail: a message whose JSON was altered in one field after signing hashes to another
    digest on the ethers side, and its signature recovers another address there (an issue time one second later
    too)."""
    case = _case(MESSAGES[message], SIGNER)
    case["message"][field] = altered
    (answer,) = asyncio.run(node_json([*typed_js, "check"], json.dumps([case]).encode()))
    assert answer["hash"] != "0x" + digest(MESSAGES[message], DOMAIN).hex()
    assert answer["recovered"] != SIGNER.address


def test_an_assignment_and_its_untimed_form_never_share_a_signature() -> None:
    """The same fields under the same type name, but rollout format 2's message has no `issuedAt`: the type hashes
    differ, so a signature over one recovers another address as the other (a worker cannot pass a timed grant off
    as untimed, whose files are never slashed as stale)."""
    timed = MESSAGES["assignment, issued at 0"]
    assert isinstance(timed, Assignment)
    untimed = UntimedAssignment(*(getattr(timed, attr) for attr, _, _ in UntimedAssignment.FIELDS))
    assert digest(timed, DOMAIN) != digest(untimed, DOMAIN)
    assert recover(untimed, sign(timed, SIGNER, DOMAIN), DOMAIN) != SIGNER.address


def test_requests_signed_by_ethers_are_served_by_the_coordinator_and_refused_when_they_should_be(
    tmp_path: Path, typed_js: list[str]
) -> None:
    pool, trainer, stranger = 5, Account.from_key(b"\x23" * 32), Account.from_key(b"\x24" * 32)
    service = coordinator_service(
        tmp_path,
        DOMAIN,
        trainer=trainer,
        worker=SIGNER.address,
        validator=OTHER.address,
        pool_id=pool,
        task_spec_hash=bytes(range(32)),
    )

    async def ethers_request(url: str, account: LocalAccount, *, pool_id: int = pool, chain_id: int = 31337) -> Any:
        key = "0x" + account.key.hex()
        args = [url, str(pool_id), str(chain_id), DOMAIN.verifying_contract, key, "POST", "{}"]
        return await node_json([*typed_js, "request", *args])

    async def main() -> None:
        async with serving(service) as (_, url):
            granted = await ethers_request(url + "/v1/tasks", SIGNER)
            assert granted["status"] == 200, granted
            body = granted["body"]
            assert (body["node"], body["counter"], body["step"]) == (SIGNER.address, 0, 0)
            shape = (body["prompts"], body["group_size"])
            assert body["task_spec_hash"] == "0x" + bytes(range(32)).hex()
            assert abs(body["issued_at"] - time.time()) < 60  # the trainer's clock, when it signed
            grant = Assignment(pool, SIGNER.address, 0, 0, *shape, bytes(range(32)), body["issued_at"])
            assert recover(grant, bytes.fromhex(body["signature"][2:]), DOMAIN) == trainer.address
            # ethers rebuilds it from the answer's JSON with types written from the docs, issuedAt included
            contract = DOMAIN.verifying_contract
            rebuilt = await node_json([*typed_js, "grant", "31337", contract], json.dumps(body).encode())
            assert rebuilt["recovered"] == trainer.address, rebuilt
            forged = await node_json(
                [*typed_js, "grant", "31337", contract],
                json.dumps(body | {"issued_at": body["issued_at"] + 1}).encode(),
            )
            assert forged["recovered"] != trainer.address
            # the query string is part of the signed path: ethers signs it as the server reads it
            with_query = await ethers_request(url + "/v1/tasks?from=ethers", SIGNER)
            assert (with_query["status"], with_query["body"]["counter"]) == (200, 1), with_query
            for refused, status, code in (
                (await ethers_request(url + "/v1/tasks", SIGNER, pool_id=pool + 1), 401, "signer_mismatch"),
                (await ethers_request(url + "/v1/tasks", SIGNER, chain_id=1), 401, "signer_mismatch"),
                (await ethers_request(url + "/v1/tasks", stranger), 403, "not_member"),
            ):
                assert (refused["status"], refused["body"]["error"]) == (status, code), refused

    asyncio.run(main())


def test_the_documented_type_strings_and_test_vector_are_the_ones_signed() -> None:
    """docs/signed-messages.md is what another implementation is written from (typed.mjs was)."""
    text = DOCS.read_text()
    assert {type(message) for message in MESSAGES.values()} == set(TypedMessage.__subclasses__())
    documented = set(re.findall(r"`([A-Z][A-Za-z]+\([a-z0-9]+ [A-Za-z]+(?:,[a-z0-9]+ [A-Za-z]+)*\))`", text))
    signed = {type(message).type_string() for message in MESSAGES.values()}
    assert signed <= documented, f"not in {DOCS.name}: {sorted(signed - documented)}"
    node_binding = "NodeBinding(address provider,address node)"  # signed for the chain (ledger/client.py)
    assert documented - signed == {node_binding}, f"documented, signed by nothing: {sorted(documented - signed)}"

    vector_key: LocalAccount = Account.from_key(b"\x11" * 32)
    vector = Checkpoint(pool_id=7, step=42, manifest_hash=b"\x03" * 32)
    assert f"at address `{vector_key.address}`" in text
    assert f"digest `0x{digest(vector, DOMAIN).hex()}`" in text
    assert f"signature `0x{sign(vector, vector_key, DOMAIN).hex()}`" in text
