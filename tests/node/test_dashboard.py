"""The worker's web dashboard: each file's challenge-window state (the chain's word first), stake, earned and at-risk
tokens, in `/api/state` and in the page as headless Chromium renders it; `prime-node start --dashboard` serves it.

The journal and the chain are real: files recorded with `WorkerState`, submitted, claimed and invalidated on anvil.
Screenshots land in each test's tmp path; their paths are printed and recorded as the test's `screenshot` property.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.events import EventPosition, WorkInvalidated
from ledger.types import PoolConfig, Reason, StakeInfo, WorkRecord, WorkStatus
from node.daemon.state import FileRecord, WorkerState
from node.dashboard import serve_dashboard
from node.dashboard.chain import WorkerChain
from node.dashboard.model import ChainReading, WorkerLive, file_state, throughput, worker_snapshot
from node.dashboard.worker import WorkerDashboard
from tests.chromium import Chromium, element_text, require_chromium, row_text
from tests.ledger.helpers import DEFAULT_POOL, make_pool, onboard
from tests.node import test_worker_daemon as worker_daemon

TOKEN = 10**18
T = TypeVar("T")

pool = worker_daemon.pool  # the fixture: a trainer process in network mode and one member node


@pytest.fixture
def chromium() -> Chromium:
    return require_chromium()


def keep_screenshot(path: Path, record_property: Callable[[str, object], None]) -> None:
    record_property("screenshot", str(path))
    print(f"screenshot: {path}")


# --- pure: states, throughput, exposure -----------------------------------------------------------------------


def record(key: bytes, stage: str, *, created: float = 0.0, units: int = 10, detail: str | None = None) -> FileRecord:
    return FileRecord(key, 0, 0, units, stage, created, created, "0xtx", detail, None)


def work(key: bytes, submitted_at: int, status: WorkStatus = WorkStatus.PENDING) -> WorkRecord:
    return WorkRecord(1, key, "0xnode", "0xprovider", 10, submitted_at, status)


def test_a_file_is_pending_until_its_window_closes_and_claimable_from_that_second() -> None:
    key = b"\x01" * 32
    submitted = record(key, "submitted")
    assert file_state(submitted, work(key, 1000), None, 3600, 4599).state == "pending"
    assert file_state(submitted, work(key, 1000), None, 3600, 4600).state == "claimable"  # claimRewards' boundary
    assert file_state(submitted, work(key, 1000), None, 3600, 4599).closes_at == 4600
    assert file_state(submitted, None, None, 3600, 4599).state == "submitted"  # the chain not read yet


def test_the_chains_invalidation_shows_before_the_journal_hears_of_it() -> None:
    key = b"\x02" * 32
    event = WorkInvalidated(1, key, "0xvalidator", int(Reason.PROOF_INVALID), 50 * TOKEN, EventPosition(9, 0, "0x"))
    state = file_state(record(key, "submitted"), work(key, 1000), event, 3600, 1001)
    assert (state.state, state.slashed) == ("invalidated", 50 * TOKEN)
    assert state.reason is not None and state.reason.startswith("proof_invalid (7)")
    journaled = file_state(record(key, "invalidated", detail="proof_invalid (7), 50 tokens slashed"), None, None, 0, 0)
    assert (journaled.state, journaled.reason) == ("invalidated", "proof_invalid (7), 50 tokens slashed")
    expired = file_state(record(key, "expired", detail="step < 1 when submitting"), None, None, 0, 0)
    assert (expired.state, expired.reason) == ("expired", "step < 1 when submitting")


def test_throughput_averages_over_the_recent_window_or_since_the_start() -> None:
    now = 10_000.0
    files = [record(bytes([i]) * 32, "submitted", created=now - age, units=300) for i, age in enumerate((900, 50, 10))]
    since_start = throughput(files, now=now, since=now - 60, window=600)  # started a minute ago: 2 files in 60 s
    assert (since_start["files"], since_start["files_per_min"], since_start["tokens_per_s"]) == (2, 2.0, 10.0)
    long_running = throughput(files, now=now, since=0.0, window=600)  # the file 900 s old is outside the window
    assert (long_running["files"], long_running["files_per_min"], long_running["estimate"]) == (2, 0.2, True)


def test_slash_exposure_counts_each_pending_file_and_is_capped_by_the_stake() -> None:
    keys = [bytes([i]) * 32 for i in range(3)]
    reading = ChainReading(
        read_at=0.0, block=1, chain_time=2000, pool=DEFAULT_POOL, decimals=18, provider="0xprovider",
        stake=StakeInfo(active=120 * TOKEN, unbonding=0, locked=100 * TOKEN, release_at=0), member=True,
        ejected=False, works={k: work(k, 1000) for k in keys}, invalidations={},
    )  # fmt: skip
    live = WorkerLive(stopping=False, held_step=3, started_at=0.0)
    records = [record(k, "submitted", units=1000) for k in keys]
    tokens = worker_snapshot(node="0xnode", pool_id=1, records=records, reading=reading, live=live, now=1.0)["tokens"]
    assert tokens["pending_files"] == 3
    assert tokens["slash_exposure"] == "120"  # 3 x 50 = 150 slashable, but only 120 are staked
    assert tokens["pending_rewards"] == "3"  # 3 x 1000 units x 1e15 per unit


def test_the_dashboard_port_comes_from_the_flags_then_the_config() -> None:
    from ledger.cli.common import CommandError
    from node.cli.start import DEFAULT_DASHBOARD_PORT, _dashboard_port

    assert _dashboard_port(None, None, {}) is None
    assert _dashboard_port(True, None, {}) == DEFAULT_DASHBOARD_PORT
    assert _dashboard_port(None, None, {"dashboard_port": 9000}) == 9000  # the config alone turns it on
    assert _dashboard_port(None, 0, {"dashboard_port": 9000}) == 0  # the flag wins
    assert _dashboard_port(False, None, {"dashboard_port": 9000}) is None
    with pytest.raises(CommandError, match="do not go together"):
        _dashboard_port(False, 9000, {})


# --- a real journal and chain, served -------------------------------------------------------------------------


@dataclass
class Journal:
    state: WorkerState
    ledger: Ledger  # read-only: what the dashboard reads with
    pool_id: int
    node: str
    keys: dict[str, bytes]
    config: PoolConfig


@pytest.fixture
def journaled(
    tmp_path: Path, chain: LocalChain, ledger_for: Callable[[int], Ledger], deployment: Deployment
) -> Iterator[Journal]:
    """A node's files in every state: claimed, claimable, pending (accepted by a validator), invalidated on chain
    but still `submitted` in the journal, written, expired. The invalidation slashed 50 of the provider's 100."""
    owner, provider, validator = ledger_for(0), ledger_for(1), ledger_for(6)
    pool_id = make_pool(owner)  # window 3600 s, 100 tokens per node, 1e15 per unit, slash 50
    node = dev_account(3)
    node_ledger = onboard(owner, provider, node, pool_id)
    owner.set_validator(pool_id, validator.address)
    owner.mint(owner.address, 1000 * TOKEN)
    owner.fund_rewards(pool_id, 1000 * TOKEN)
    state = WorkerState(tmp_path / "state", chain_id=deployment.chain_id, pool_id=pool_id, node=node.address)
    keys: dict[str, bytes] = {}

    def write(name: str, units: int, step: int) -> bytes:
        data = f"rollouts of {name}".encode()
        key = keys[name] = hashlib.sha256(data).digest()
        state.path_of(key).write_bytes(data)
        state.add(key, step=step, counter=len(keys), units=units)
        return key

    def submit(*names: str) -> None:
        batch = [keys[n] for n in names]
        units = [state.get(k).units for k in batch]  # type: ignore[union-attr]
        receipt = node_ledger.submit_work_batch(pool_id, batch, units)
        state.move(batch, "submitted", tx="0x" + bytes(receipt["transactionHash"]).hex())

    write("claimed", 1000, 0)
    write("claimable", 2000, 0)
    submit("claimed", "claimable")
    chain.increase_time(3601)
    write("pending", 3000, 1)
    write("cheat", 4000, 1)
    submit("pending", "cheat")
    state.note_verdict(keys["pending"], f"accepted by {validator.address}")
    provider.claim_rewards(pool_id, [keys["claimed"]])
    state.move([keys["claimed"]], "claimed")
    validator.invalidate_work(pool_id, keys["cheat"], Reason.PROOF_INVALID)  # the journal has not looked yet
    write("written", 500, 2)
    write("expired", 600, 0)
    state.move([keys["expired"]], "expired", detail="step < 1 when submitting")
    yield Journal(state, Ledger(chain.w3, deployment), pool_id, node.address, keys, owner.pool(pool_id).config)
    state.close()


async def with_dashboard(journal: Journal, use: Callable[[str, WorkerDashboard], Awaitable[T]]) -> T:
    """Serves the journal's dashboard on a free port until `use(url, source)` returns, after a first chain read."""
    live = WorkerLive(stopping=False, held_step=1, started_at=time.time() - 120)
    source = WorkerDashboard(
        journal.state, WorkerChain(journal.ledger, journal.pool_id, journal.node), lambda: live, refresh_seconds=0.2
    )
    runner, url = await serve_dashboard(source, "127.0.0.1", 0)
    try:
        deadline = time.monotonic() + 30
        while source.reading is None:
            assert time.monotonic() < deadline, f"no chain reading: {source.error}"
            await asyncio.sleep(0.05)
        return await use(url, source)
    finally:
        await runner.cleanup()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_the_state_api_puts_the_chains_word_first_and_accounts_for_every_token(journaled: Journal) -> None:
    async def use(url: str, _: WorkerDashboard) -> Any:
        return await asyncio.to_thread(get_json, f"{url}/api/state")

    state = asyncio.run(with_dashboard(journaled, use))
    files = {f["work_key"]: f for f in state["files"]}
    by_name = {name: files["0x" + key.hex()] for name, key in journaled.keys.items()}
    assert {name: f["state"] for name, f in by_name.items()} == {
        "claimed": "claimed",
        "claimable": "claimable",
        "pending": "pending",
        "cheat": "invalidated",  # the journal still says submitted; the chain said it first
        "written": "written",
        "expired": "expired",
    }
    assert by_name["cheat"]["stage"] == "submitted" and by_name["cheat"]["slashed"] == "50"
    assert by_name["cheat"]["reward"] is None and by_name["expired"]["reward"] is None  # never paid
    assert by_name["cheat"]["reason"].startswith("proof_invalid (7); validator ")
    pending = by_name["pending"]
    work = journaled.ledger.get_work(journaled.pool_id, journaled.keys["pending"])
    assert pending["closes_at"] == work.submitted_at + journaled.config.challenge_window
    assert pending["verdict"] == f"accepted by {dev_account(6).address}" and pending["reward"] == "3"
    assert state["standing"] == "ejected" and state["step"] == 1
    assert state["stake"]["active"] == "50" and state["stake"]["node_locked"] == "0"  # 100 staked, 50 slashed
    assert state["tokens"] == {
        "claimed": "1",  # 1000 units x 1e15
        "claimable": "2",
        "pending_rewards": "3",
        "slash_exposure": "50",  # one pending file x 50, and 50 left to slash
        "pending_files": 1,
        "lost_rewards": "4",
        "slashed": "50",
    }
    assert state["counts"]["submitted"] == 3 and state["files_total"] == 6
    assert state["chain"]["error"] is None and state["chain"]["block"] >= 1


def test_the_page_in_chromium_shows_each_files_state_and_the_stake(
    journaled: Journal, chromium: Chromium, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    async def use(url: str, _: WorkerDashboard) -> tuple[str, Path]:
        dom = await asyncio.to_thread(chromium.dom, url)
        shot = await asyncio.to_thread(chromium.screenshot, url, tmp_path / "dashboard-worker.png")
        return dom, shot

    dom, shot = asyncio.run(with_dashboard(journaled, use))
    keep_screenshot(shot, record_property)
    row = {name: row_text(dom, "0x" + key.hex()) for name, key in journaled.keys.items()}
    work = journaled.ledger.get_work(journaled.pool_id, journaled.keys["pending"])
    closes = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(work.submitted_at + 3600))
    assert f"pending until {closes}" in row["pending"], row["pending"]
    assert f"accepted by {dev_account(6).address}" in row["pending"]
    assert "invalidated: proof_invalid (7)" in row["cheat"] and "slashed 50 tokens" in row["cheat"]
    assert "claimable" in row["claimable"] and "reward claimed" in row["claimed"]
    assert "never submitted: step < 1 when submitting" in row["expired"]
    assert element_text(dom, "stake-active") == "50 tokens"
    assert element_text(dom, "standing") == "ejected"
    assert element_text(dom, "earned") == "1 tokens" and element_text(dom, "slash-exposure") == "50 tokens"


# --- the daemon serves it -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_prime_node_start_dashboard_shows_a_submitted_files_state_and_the_stake(
    pool: worker_daemon.Pool, chromium: Chromium, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    process = worker_daemon.start(pool, "--dashboard", "--dashboard-port", "0", "--submit-batch", "1", log="dash.log")
    log = pool.root / "dash.log"
    try:
        worker_daemon.wait_for(lambda: "dashboard on http://127.0.0.1:" in log.read_text(), "the dashboard's URL")
        found = re.search(r"dashboard on (http://127\.0\.0\.1:\d+)", log.read_text())
        assert found, log.read_text()[-3000:]
        url = found.group(1)
        worker_daemon.wait_for(
            lambda: any(s == "submitted" for s, _ in worker_daemon.journal(pool).values()), "a submitted file"
        )
        key = "0x" + next(k for k, (s, _) in worker_daemon.journal(pool).items() if s == "submitted")

        def shown_pending() -> bool:  # the dashboard reads the chain every 5 s
            files = {f["work_key"]: f for f in get_json(f"{url}/api/state")["files"]}
            return key in files and files[key]["state"] == "pending"

        worker_daemon.wait_for(shown_pending, "the file pending in /api/state", timeout=30)
        dom = chromium.dom(url)
        keep_screenshot(chromium.screenshot(url, tmp_path / "dashboard-daemon.png"), record_property)
    finally:
        process.send_signal(signal.SIGTERM)
        code = worker_daemon.finish(pool, process, "dash.log")
    assert code == 0, log.read_text()[-3000:]  # SIGTERM stops the dashboard with the daemon
    assert "pending until " in row_text(dom, key)
    assert element_text(dom, "stake-active") == "100 tokens"  # onboarding staked 100; nothing slashed
    assert element_text(dom, "stake-node-locked") == "100 tokens"
    assert element_text(dom, "standing") == "member" and "running" in element_text(dom, "daemon")
    assert element_text(dom, "step") == "0"
