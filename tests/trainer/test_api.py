"""The coordinator API on a real aiohttp server: every refusal of issue 5's acceptance 6 has its own 4xx."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from eth_account import Account

from core.metrics import CONTENT_TYPE
from protocol.coordinator.client import CoordinatorClient, CoordinatorLostFile, NoWorkYet, PublishedStep, Verdict
from protocol.rollouts import NO_TARGET_LENGTH, RolloutMeta, RolloutRow, SamplingMeta, encode_rollouts
from protocol.signing import Assignment, Attestation, SigningDomain, UploadReceipt, recover, sign, sign_request
from tests.loopback_coordinator import coordinator_service, serving
from tests.promtool import check_metrics
from trainer.api import CoordinatorApi
from trainer.coordinator import STEP_HISTORY, ApiConfig, PoolState
from trainer.inbox import RolloutInbox
from trainer.services import load_published, publish_step
from trainer.verdicts import VerdictStore

DOMAIN = SigningDomain(31337, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0")
POOL = 4
WORKER = Account.from_key(b"\x11" * 32)
STRANGER = Account.from_key(b"\x12" * 32)
VALIDATOR = Account.from_key(b"\x13" * 32)
TRAINER = Account.from_key(b"\x14" * 32)
TASK_SPEC_HASH = bytes(range(32))


def rollout_bytes(node: str = WORKER.address, pool: int = POOL, rows: int = 4, proof_bytes: int = 258) -> bytes:
    """A well-formed file; `proof_bytes` of random proof per row make it as large as needed (they do not compress)."""
    rng = random.Random(rows)
    meta = RolloutMeta(
        pool_id=pool,
        node=node,
        manifest_hash=b"\x01" * 32,
        sampling=SamplingMeta(temperature=1.0, top_p=1.0, max_tokens=16),
        task_spec_hash=b"\x02" * 32,
        model_hash=b"\x03" * 32,
        counter=0,
        created_by="prime-node test",
    )
    return encode_rollouts(
        meta,
        [
            RolloutRow(
                problem_id=f"p/{i // 2}",
                group=i // 2,
                input_tokens=[rng.randrange(96) for _ in range(4)],
                output_tokens=[rng.randrange(96) for _ in range(3)],
                output_logprobs=[-0.5, -0.25, -1.0],
                finish_reason="stop",
                reward=float(i % 2),
                task_reward=float(i % 2),
                length_penalty=0.0,
                target_length=NO_TARGET_LENGTH,
                seed=i,
                step=0,
                proofs=rng.randbytes(proof_bytes),
            )
            for i in range(rows)
        ],
    )


@dataclass
class Reply:
    status: int
    body: dict[str, Any]


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        signer: Any = WORKER,
        headers: dict[str, str] | None = None,
        now: int | None = None,
        nonce: bytes | None = None,
    ) -> Reply:
        host = urllib.parse.urlsplit(self.url).netloc
        signed = (
            {}
            if signer is None
            else sign_request(signer, DOMAIN, method, path, body, pool_id=POOL, host=host, now=now, nonce=nonce)
        )
        async with self.session.request(method, self.url + path, data=body, headers=signed | (headers or {})) as r:
            return Reply(r.status, json.loads(await r.read() or b"{}"))


def run(tmp_path: Path, scenario: Callable[[Client, CoordinatorApi], Awaitable[None]], **config: Any) -> None:
    async def main() -> None:
        service = coordinator_service(
            tmp_path,
            DOMAIN,
            trainer=TRAINER,
            worker=WORKER.address,
            validator=VALIDATOR.address,
            pool_id=POOL,
            verdicts=VerdictStore(tmp_path / "attestations.jsonl"),
            config=ApiConfig(**config),
            task_spec_hash=TASK_SPEC_HASH,
        )
        async with serving(service) as (api, url), aiohttp.ClientSession() as session:
            await scenario(Client(session, url), api)

    asyncio.run(main())


def upload_path(data: bytes) -> str:
    return f"/v1/rollouts/{hashlib.sha256(data).hexdigest()}"


def test_a_member_uploads_once_and_the_same_bytes_again_change_nothing(tmp_path: Path) -> None:
    data = rollout_bytes()

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        first = await client.send("PUT", upload_path(data), data)
        again = await client.send("PUT", upload_path(data), data)
        assert (first.status, first.body["created"]) == (201, True)
        assert (again.status, again.body["created"]) == (200, False)
        async with client.session.get(client.url + upload_path(data)) as response:
            assert response.status == 200 and await response.read() == data

    run(tmp_path, scenario)
    assert RolloutInbox(tmp_path / "inbox").uploads() == [hashlib.sha256(data).digest()]


def test_metrics_count_requests_by_route_and_status_in_a_page_promtool_passes(tmp_path: Path) -> None:
    data = rollout_bytes()

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        assert (await client.send("PUT", upload_path(data), data)).status == 201
        assert (await client.send("POST", "/v1/tasks", b"{}", signer=STRANGER)).status == 403
        async with client.session.get(client.url + "/metrics") as response:
            assert response.status == 200 and response.headers["Content-Type"] == CONTENT_TYPE
            page = await response.text()
        check_metrics(page)
        samples = dict(line.rsplit(" ", 1) for line in page.splitlines() if not line.startswith("#"))
        assert samples["coordinator_uploads_total"] == "1" and samples["coordinator_step"] == "0"
        routes = {key for key in samples if key.startswith("coordinator_requests_total{")}
        assert any('status="201"' in key for key in routes) and any('status="403"' in key for key in routes)

    run(tmp_path, scenario)


@pytest.mark.parametrize("megabytes", [1, 10, 50])
def test_a_large_upload_is_stored_whole_and_a_validator_downloads_it_whole(tmp_path: Path, megabytes: int) -> None:
    # aiohttp's content.read(n) returns what is buffered, not n bytes: a body read in one call was a 64-112 KB
    # prefix, so uploads of 256 KB were refused (the signed hash is of the whole body) and downloads truncated
    data = rollout_bytes(rows=1024, proof_bytes=megabytes * 1024)
    work_key = hashlib.sha256(data).digest()
    assert megabytes * 2**20 <= len(data) < (megabytes + 1) * 2**20

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        worker = CoordinatorClient(client.session, client.url, WORKER, DOMAIN)
        validator = CoordinatorClient(client.session, client.url, VALIDATOR, DOMAIN)
        assert (await worker.upload(work_key, data)).created
        downloaded = await validator.download(work_key, len(data))
        assert downloaded is not None and hashlib.sha256(downloaded).digest() == work_key

    run(tmp_path, scenario)
    assert RolloutInbox(tmp_path / "inbox").uploads() == [work_key]


def test_an_upload_is_receipted_by_the_trainer_and_a_lost_file_is_gone_not_missing(tmp_path: Path) -> None:
    data = rollout_bytes()
    work_key = hashlib.sha256(data).digest()

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        worker = CoordinatorClient(client.session, client.url, WORKER, DOMAIN)
        first, again = await worker.upload(work_key, data), await worker.upload(work_key, data)
        for upload in (first, again):
            assert upload.receipt is not None
            assert recover(UploadReceipt(POOL, work_key, WORKER.address), upload.receipt, DOMAIN) == TRAINER.address
        api.service.inbox.path(work_key).unlink()  # the coordinator's disk loses the file it acknowledged
        with pytest.raises(CoordinatorLostFile, match="acknowledged"):
            await worker.download(work_key, len(data))
        assert await worker.download(hashlib.sha256(b"never sent").digest(), 100) is None  # unknown: 404

    run(tmp_path, scenario)


def test_each_bad_request_gets_its_own_refusal(tmp_path: Path) -> None:
    data = rollout_bytes()
    path = upload_path(data)
    limit = max(len(data), len(rollout_bytes(node=STRANGER.address)), len(rollout_bytes(pool=POOL + 1))) + 10
    big = b"\0" * (limit + 1)

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        refusals = {
            "unsigned": await client.send("PUT", path, data, signer=None),
            "expired": await client.send("PUT", path, data, now=int(time.time()) - 3600),
            "non-member": await client.send("PUT", path, data, signer=STRANGER),
            "mismatched hash": await client.send("PUT", upload_path(data + b"x"), data),
            "oversized": await client.send("PUT", upload_path(big), big),
            "malformed": await client.send("PUT", upload_path(b"not parquet"), b"not parquet"),
            "another node's file": await client.send(
                "PUT", upload_path(rollout_bytes(node=STRANGER.address)), rollout_bytes(node=STRANGER.address)
            ),
            "another pool's file": await client.send(
                "PUT", upload_path(rollout_bytes(pool=POOL + 1)), rollout_bytes(pool=POOL + 1)
            ),
        }
        nonce = b"\x07" * 16
        fresh = await client.send("POST", "/v1/tasks", b"{}", nonce=nonce)
        refusals["replayed nonce"] = await client.send("POST", "/v1/tasks", b"{}", nonce=nonce)
        assert fresh.status == 200
        expected = {
            "unsigned": (401, "missing_header"),
            "expired": (401, "timestamp_skew"),
            "non-member": (403, "not_member"),
            "mismatched hash": (400, "hash_mismatch"),
            "oversized": (413, "too_large"),
            "malformed": (422, "malformed_file"),
            "another node's file": (403, "wrong_node"),
            "another pool's file": (422, "wrong_pool"),
            "replayed nonce": (409, "replayed_nonce"),
        }
        got = {name: (reply.status, reply.body.get("error")) for name, reply in refusals.items()}
        assert got == expected
        assert all(reply.body.get("message") for reply in refusals.values())

    run(tmp_path, scenario, max_upload_bytes=limit)
    assert RolloutInbox(tmp_path / "inbox").uploads() == []  # nothing refused was stored


def test_an_oversized_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    data = rollout_bytes()

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        reply = await client.send("PUT", upload_path(data), data)
        assert (reply.status, reply.body["error"]) == (413, "too_large")

    run(tmp_path, scenario, max_upload_bytes=len(data) - 1)


def test_tasks_hand_each_node_increasing_counters(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        api.service.state.step = 3
        first = await client.send("POST", "/v1/tasks", b"{}")
        second = await client.send("POST", "/v1/tasks", b"{}")
        assert (first.body["counter"], second.body["counter"]) == (0, 1)
        assert first.body["step"] == 3 and first.body["node"] == WORKER.address
        # each assignment comes signed by the trainer, over exactly what was handed out (issue 19) and when, by the
        # trainer's clock (issue 32)
        shape = (first.body["prompts"], first.body["group_size"])
        assert abs(first.body["issued_at"] - time.time()) < 60
        grant = Assignment(POOL, WORKER.address, 3, 0, *shape, TASK_SPEC_HASH, first.body["issued_at"])
        assert first.body["task_spec_hash"] == "0x" + TASK_SPEC_HASH.hex()
        assert recover(grant, bytes.fromhex(first.body["signature"][2:]), DOMAIN) == TRAINER.address
        for other in (dataclasses.replace(grant, counter=1), dataclasses.replace(grant, issued_at=grant.issued_at + 1)):
            assert recover(other, bytes.fromhex(first.body["signature"][2:]), DOMAIN) != TRAINER.address
        stranger = await client.send("POST", "/v1/tasks", b"{}", signer=STRANGER)
        assert stranger.status == 403

    run(tmp_path, scenario)


def test_a_node_gets_its_share_of_each_step_then_waits_for_the_next_step(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        api.service.state.step = 3
        given = [await client.send("POST", "/v1/tasks", b"{}") for _ in range(2)]
        assert [g.body["counter"] for g in given] == [0, 1]
        started = time.monotonic()
        over = await client.send("POST", "/v1/tasks", b"{}")  # held for hold_seconds, then refused
        assert over.status == 503 and over.body["error"] == "no_work" and "step 4" in over.body["message"]
        assert time.monotonic() - started >= 0.3
        async with aiohttp.ClientSession() as session:  # the worker's client tells "no work yet" from an outage
            worker = CoordinatorClient(session, client.url, WORKER, DOMAIN)
            with pytest.raises(NoWorkYet) as refused:
                await worker.request_task()
            assert refused.value.retry_after == 2.5
            # a request held while the trainer publishes the next step gets that step's assignment at once
            held = asyncio.create_task(worker.request_task())
            await asyncio.sleep(0.1)
            assert not held.done()
            api.service.state.publish(4, time.time())
            job = await asyncio.wait_for(held, timeout=0.25)
        assert (job.step, job.counter) == (4, 2)  # counters keep rising: a work key is never reused

    run(tmp_path, scenario, files_per_node_per_step=2, retry_after=2.5, hold_seconds=0.3)


def test_a_node_with_enough_untrained_uploads_waits_until_the_trainer_trains_on_them(tmp_path: Path) -> None:
    waiting = {WORKER.address: 1}  # the node's uploads the trainer has not consumed, as the training loop counts

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        api.service.pending = lambda node: waiting[node]
        first = await client.send("POST", "/v1/tasks", b"{}")
        assert (first.status, first.body["step"]) == (200, 0)
        waiting[WORKER.address] = 2
        held = asyncio.create_task(client.send("POST", "/v1/tasks", b"{}"))
        await asyncio.sleep(0.1)
        assert not held.done()
        waiting[WORKER.address] = 0  # the trainer trained on them, then published the next step
        api.service.state.publish(1, time.time())
        answer = await asyncio.wait_for(held, timeout=0.5)
        assert (answer.status, answer.body["step"], answer.body["counter"]) == (200, 1, 1)
        waiting[WORKER.address] = 2  # and now a step comes and goes without training on them
        over = asyncio.create_task(client.send("POST", "/v1/tasks", b"{}"))
        await asyncio.sleep(0.1)
        api.service.state.publish(2, time.time())
        refused = await over
        assert refused.status == 503 and refused.body["error"] == "no_work"
        assert "2 uploads the trainer has not trained on yet" in refused.body["message"]

    run(tmp_path, scenario, pending_files_per_node=2, hold_seconds=0.3)


def test_the_pool_gets_no_more_files_in_flight_than_its_window_trains_on(tmp_path: Path) -> None:
    """trainer.in_flight: an assignment stops counting when its file is trained on, vetoed, or its step leaves the
    window; until then a request over `max_files_in_flight` waits for the next step, then gets 503 no_work."""

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        given = [await client.send("POST", "/v1/tasks", b"{}") for _ in range(2)]
        assert [(g.status, g.body["step"], g.body["counter"]) for g in given] == [(200, 0, 0), (200, 0, 1)]
        over = await client.send("POST", "/v1/tasks", b"{}")
        assert over.status == 503 and over.body["error"] == "no_work"
        assert "2 files in flight" in over.body["message"]
        data = rollout_bytes()  # the file of counter 0; a validator rejects it: nobody will train on it
        assert (await client.send("PUT", upload_path(data), data)).status in (200, 201)
        key = hashlib.sha256(data).digest()
        vetoed = await client.send("POST", "/v1/attestations", signed_attestation(VALIDATOR, key, False, 6),
                                   signer=VALIDATOR)  # fmt: skip
        assert vetoed.status in (200, 201)
        third = await client.send("POST", "/v1/tasks", b"{}")
        assert (third.status, third.body["counter"]) == (200, 2)
        assert (await client.send("POST", "/v1/tasks", b"{}")).status == 503
        api.service.in_flight.settle([(WORKER.address, 1)])  # the trainer trained on counter 1's file
        assert (await client.send("POST", "/v1/tasks", b"{}")).body["counter"] == 3
        assert (await client.send("POST", "/v1/tasks", b"{}")).status == 503
        api.service.state.publish(1, time.time())  # step 0 is still in the window of step 1 (k = 1)
        assert (await client.send("POST", "/v1/tasks", b"{}")).status == 503
        api.service.state.publish(2, time.time())  # and not in step 2's: its files could only go stale
        fresh = await client.send("POST", "/v1/tasks", b"{}")
        assert (fresh.status, fresh.body["step"], fresh.body["counter"]) == (200, 2, 4)

    run(tmp_path, scenario, max_files_in_flight=2, async_level=1, hold_seconds=0.05)


def test_only_validators_attest_and_only_with_their_own_signature(tmp_path: Path) -> None:
    work_key = b"\x42" * 32

    def attestation(signer: Any, accepted: bool = False, reason: int = 7) -> bytes:
        message = Attestation(pool_id=POOL, work_key=work_key, accepted=accepted, reason=reason)
        signature = sign(message, signer, DOMAIN)
        return json.dumps(
            {
                "work_key": "0x" + work_key.hex(),
                "accepted": accepted,
                "reason": reason,
                "signature": "0x" + signature.hex(),
            }
        ).encode()

    async def scenario(client: Client, api: CoordinatorApi) -> None:
        ok = await client.send("POST", "/v1/attestations", attestation(VALIDATOR), signer=VALIDATOR)
        worker = await client.send("POST", "/v1/attestations", attestation(WORKER), signer=WORKER)
        forged = await client.send("POST", "/v1/attestations", attestation(STRANGER), signer=VALIDATOR)
        junk = await client.send("POST", "/v1/attestations", b"{", signer=VALIDATOR)
        assert ok.status == 201
        assert (worker.status, worker.body["error"]) == (403, "not_validator")
        assert (forged.status, forged.body["error"]) == (400, "bad_attestation")
        assert (junk.status, junk.body["error"]) == (400, "bad_attestation")

    run(tmp_path, scenario)
    records = [json.loads(line) for line in (tmp_path / "attestations.jsonl").read_text().splitlines()]
    assert records == [
        {
            "work_key": "0x" + work_key.hex(),
            "accepted": False,
            "reason": 7,
            "validator": VALIDATOR.address,
            "signature": records[0]["signature"],
        }
    ]


@pytest.mark.parametrize("path", ["/v1/rollouts/XYZ", "/v1/rollouts/" + "A" * 64, "/v1/rollouts/" + "0" * 63])
def test_a_bad_upload_name_is_refused(tmp_path: Path, path: str) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        reply = await client.send("PUT", path, b"data")
        assert (reply.status, reply.body["error"]) == (400, "bad_name")

    run(tmp_path, scenario)


def test_steps_lists_when_each_step_became_current_and_the_client_reads_it(tmp_path: Path) -> None:
    async def scenario(client: Client, api: CoordinatorApi) -> None:
        for step, at in ((0, 1000.0), (1, 1060.5), (2, 1130.25)):
            api.service.state.publish(step, at)
        assert api.service.state.publish(2, 9999.0) is None  # a restart republishing a step keeps its first time
        reply = await client.send("GET", "/v1/steps", signer=None)
        assert reply.status == 200
        assert reply.body == {
            "steps": [{"step": 0, "at": 1000.0}, {"step": 1, "at": 1060.5}, {"step": 2, "at": 1130.25}]
        }
        steps = await CoordinatorClient(client.session, client.url, WORKER, DOMAIN).steps()
        assert steps == [PublishedStep(0, 1000.0), PublishedStep(1, 1060.5), PublishedStep(2, 1130.25)]
        assert (await client.send("GET", "/v1/step", signer=None)).body == {"step": 2}

    run(tmp_path, scenario)


def test_the_step_history_is_bounded_and_survives_a_restart(tmp_path: Path) -> None:
    state = PoolState(pool_id=POOL, trainer=TRAINER.address)
    record = tmp_path / "steps.jsonl"
    for step in range(STEP_HISTORY + 5):
        publish_step(state, step, record)
    assert len(state.history) == STEP_HISTORY and state.history[0].step == 5
    with record.open("a") as cut:
        cut.write('{"step": 99')  # a line cut by a crash is skipped
    restarted = PoolState(pool_id=POOL, trainer=TRAINER.address)
    restarted.remember(load_published(record))
    publish_step(restarted, STEP_HISTORY + 4, record)  # the trainer resumes at its last step: same time as before
    assert list(restarted.history) == list(state.history)


def test_a_wait_for_the_next_step_ends_when_it_is_published_and_not_before() -> None:
    async def scenario() -> None:
        state = PoolState(pool_id=POOL, trainer=TRAINER.address, step=3)
        await asyncio.wait_for(state.wait_past(2, timeout=5), 1)  # step 3 is already past step 2
        waiting = [asyncio.create_task(state.wait_past(3, timeout=5)) for _ in range(2)]
        await asyncio.sleep(0.05)
        state.publish(3, time.time())  # the same step again (a restart's republication) wakes nobody
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting)
        state.publish(4, time.time())
        await asyncio.wait_for(asyncio.gather(*waiting), 0.5)  # woken by the publication, not by the timeout
        started = time.monotonic()
        await state.wait_past(4, timeout=0.2)  # nothing published: the timeout ends it
        assert time.monotonic() - started >= 0.2

    asyncio.run(scenario())


def signed_attestation(signer: Any, work_key: bytes, accepted: bool, reason: int) -> bytes:
    signature = sign(Attestation(pool_id=POOL, work_key=work_key, accepted=accepted, reason=reason), signer, DOMAIN)
    body = {
        "work_key": "0x" + work_key.hex(),
        "accepted": accepted,
        "reason": reason,
        "signature": "0x" + signature.hex(),
    }
    return json.dumps(body).encode()


def test_a_files_attestations_are_listed_signed_and_survive_a_restart_after_a_cut_line(tmp_path: Path) -> None:
    data = b"rollout file bytes"
    work_key = hashlib.sha256(data).digest()

    async def first(client: Client, api: CoordinatorApi) -> None:
        api.service.inbox.put(work_key, data, WORKER.address)
        reader = CoordinatorClient(client.session, client.url, WORKER, DOMAIN)
        assert await reader.attestations(work_key, POOL) == []
        posted = await client.send(
            "POST", "/v1/attestations", signed_attestation(VALIDATOR, work_key, True, 0), signer=VALIDATOR
        )
        assert posted.status == 201
        assert await reader.attestations(work_key, POOL) == [Verdict(VALIDATOR.address, True, 0)]
        unknown = await client.send("GET", f"/v1/rollouts/{'ab' * 32}/attestations", b"", signer=None)
        assert (unknown.status, unknown.body["error"]) == (404, "not_found")

    run(tmp_path, first)
    log = tmp_path / "attestations.jsonl"
    log.write_bytes(log.read_bytes() + b'{"work_key": "0x42')  # a crash in the middle of the next line

    async def after_restart(client: Client, api: CoordinatorApi) -> None:
        reader = CoordinatorClient(client.session, client.url, WORKER, DOMAIN)
        assert await reader.attestations(work_key, POOL) == [Verdict(VALIDATOR.address, True, 0)]
        changed = signed_attestation(VALIDATOR, work_key, False, 7)  # a validator's later verdict replaces its first
        assert (await client.send("POST", "/v1/attestations", changed, signer=VALIDATOR)).status == 201
        assert await reader.attestations(work_key, POOL) == [Verdict(VALIDATOR.address, False, 7)]

    run(tmp_path, after_restart)
    lines = log.read_bytes().splitlines()
    assert lines[1] == b'{"work_key": "0x42' and json.loads(lines[2])["reason"] == 7  # the new record has its own line
