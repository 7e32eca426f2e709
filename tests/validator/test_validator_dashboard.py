"""The validator's web dashboard: verdicts, rejections by reason, invalidations sent, backlog and cursor, from the
daemon's store, in `/api/state` and in headless Chromium; `prime-validate run --dashboard-port` serves it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.merkle import BatchTree, Leaf
from ledger.types import Reason
from node.dashboard import serve_dashboard
from protocol.batches import encode_leaves
from tests.chromium import Chromium, element_text, find_chromium, require_chromium, row_text
from tests.ledger.helpers import make_pool, onboard
from tests.network_trainer import TASK
from tests.validator.batching import submit
from validator.dashboard import ValidatorDashboard
from validator.store import ATTESTED, INVALIDATED, UNAVAILABLE, BatchSubmission, Submission, ValidatorStore
from validator.verdict import accept, reject

VALIDATOR = dev_account(2)


def key_of(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def listed_batches(store: ValidatorStore, names: tuple[str, ...]) -> dict[str, Submission]:
    """A batch of one file per name, in blocks 10, 11 ... (units 100, 101 ...), each recorded and listed as the
    daemon lists one: its file a `seen` row. Returns the files."""
    node, files = dev_account(3).address, {}
    for i, name in enumerate(names):
        leaf = Leaf(key_of(name), 100 + i)
        tree = BatchTree([leaf])
        batch = BatchSubmission(1, tree.root, node, 1, leaf.units, 10 + i, 0, 1_700_000_000, slot=i)
        store.record([], next_block=20, batches=[batch])
        files[name] = Submission(
            1, leaf.work_key, node, leaf.units, batch.block, 0, batch.submitted_at, root=tree.root, leaf_index=0,
            slot=i,
        )  # fmt: skip
        store.list_batch(batch, encode_leaves([leaf]), [files[name]], mine=lambda key: True)
    return files


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ValidatorStore]:
    """Five files, each of a batch of its own: accepted, rejected and invalidated by this validator, rejected but
    invalidated by another, unavailable (attested, invalidation pending), and one still to verify after a failed
    download."""
    store = ValidatorStore.open(
        tmp_path / "state", chain_id=31337, work_ledger="0x" + "11" * 20, pool_id=1, validator=VALIDATOR.address
    )
    rows = listed_batches(store, ("good", "faked", "late", "missing", "waiting"))
    store.record_verdict(rows["good"], accept("every check passed"))
    store.move(rows["good"], ATTESTED)
    store.record_verdict(rows["faked"], reject(Reason.REWARD_MISMATCH, "rewards", "row 0: reward 1.0, recomputed 0.0"))
    store.move(rows["faked"], INVALIDATED, tx_hash="0x" + "ab" * 32)
    store.record_verdict(rows["late"], reject(Reason.REWARD_MISMATCH, "rewards", "row 1: reward 2.0, recomputed 0.0"))
    store.move(rows["late"], INVALIDATED, note="its batch is already invalidated on chain")
    store.record_verdict(rows["missing"], reject(Reason.FILE_UNAVAILABLE, "download", "gone"), stage=UNAVAILABLE)
    store.retry_later(rows["waiting"], 5.0, "the coordinator does not have the file yet")
    yield store
    store.close()


def test_the_validator_view_counts_verdicts_reasons_invalidations_and_the_backlog(
    store: ValidatorStore, chain: LocalChain, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    binary = find_chromium()
    source = ValidatorDashboard(
        store,
        validator=VALIDATOR.address,
        cursor=lambda: 20,
        head=lambda: int(chain.w3.eth.block_number),
        stopping=lambda: False,
        refresh_seconds=0.2,
    )

    async def serve() -> tuple[Any, str | None, Path | None]:
        runner, url = await serve_dashboard(source, "127.0.0.1", 0)
        try:
            while source.head_block is None:
                await asyncio.sleep(0.05)
            state = await asyncio.to_thread(get_json, f"{url}/api/state")
            if binary is None:
                return state, None, None
            chromium = Chromium(binary)
            dom = await asyncio.to_thread(chromium.dom, url)
            shot = await asyncio.to_thread(chromium.screenshot, url, tmp_path / "dashboard-validator.png")
            return state, dom, shot
        finally:
            await runner.cleanup()

    state, dom, shot = asyncio.run(serve())
    assert (state["role"], state["validator"], state["cursor_block"]) == ("validator", VALIDATOR.address, 20)
    assert state["head_block"] == chain.w3.eth.block_number
    assert (state["seen"], state["verified"], state["accepted"], state["rejected"]) == (5, 4, 1, 3)
    assert state["rejections_by_reason"] == [
        {"reason": "reward_mismatch (6)", "count": 2},
        {"reason": "file_unavailable (8)", "count": 1},
    ]
    assert state["invalidations_sent"] == 1  # "late" was invalidated by someone else: not sent by this validator
    assert state["backlog"] == 2  # "missing" still to invalidate, "waiting" still to verify
    files = {f["work_key"]: f for f in state["files"]}
    assert files["0x" + key_of("waiting").hex()]["last_error"] == "the coordinator does not have the file yet"
    assert [f["block"] for f in state["files"]] == [14, 13, 12, 11, 10]  # newest first

    if dom is None or shot is None:
        require_chromium()  # skips, or fails under CI=true
    assert dom is not None and shot is not None
    record_property("screenshot", str(shot))
    print(f"screenshot: {shot}")
    assert element_text(dom, "invalidations-sent") == "1" and element_text(dom, "backlog") == "2 files"
    assert element_text(dom, "cursor-block") == "20" and element_text(dom, "rejected") == "3"
    faked = row_text(dom, "0x" + key_of("faked").hex())
    assert "rejected reward_mismatch (6) at rewards" in faked and "row 0: reward 1.0, recomputed 0.0" in faked
    assert "retrying: the coordinator does not have the file yet" in row_text(dom, "0x" + key_of("waiting").hex())


@pytest.mark.slow
def test_prime_validate_run_serves_the_dashboard_with_the_backlog_it_reads_from_the_chain(
    tmp_path: Path, chain: LocalChain, ledger_for: Callable[[int], Ledger], deployment: Deployment
) -> None:
    owner = ledger_for(0)
    pool_id = make_pool(owner)
    node_ledger = onboard(owner, ledger_for(1), dev_account(3), pool_id)
    owner.set_validator(pool_id, VALIDATOR.address)
    submit(node_ledger, pool_id, BatchTree([Leaf(key_of("never uploaded"), 123)]))
    deployment.save(tmp_path / "deployment.json")
    dead = (
        "http://127.0.0.1:9"  # the coordinator is down: the leaf list is tried again later, never held against anyone
    )
    log = tmp_path / "validator.log"
    command = [
        sys.executable, "-m", "validator.cli", "run", "--pool", str(pool_id), "--dev-key", "2",
        "--deployment", "deployment.json", "--state", "validator-state", "--coordinator", dead, "--checkpoints", dead,
        "--task", str(TASK), "--poll", "0.2", "--dashboard-port", "0",
    ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while "dashboard on http://127.0.0.1:" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        found = re.search(r"dashboard on (http://127\.0\.0\.1:\d+)", log.read_text())
        assert found, log.read_text()
        endpoints = json.loads((tmp_path / "validator-state" / "endpoints.json").read_text())
        assert endpoints == {"dashboard": found.group(1)}
        while (state := get_json(f"{found.group(1)}/api/state"))["backlog"] < 1:
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    assert code == 0, log.read_text()[-3000:]
    assert (state["role"], state["pool_id"], state["backlog"], state["verified"]) == ("validator", pool_id, 1, 0)
    assert state["cursor_block"] > deployment.block
    assert (state["seen"], state["files"]) == (0, [])  # the batch's files are known once its leaf list is fetched
