"""Simulated faults: each falsifies what a real cheater would, none runs outside a local devnet, and each is a
wrapper (`FaultyWorker`) around the honest daemon, whose own loop has no branch for any of them."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from eth_account import Account

from engine.model.loading import load_model
from engine.model.tiny import init_model
from node.config import WorkerSettings
from node.daemon.faults import (
    Fault,
    FaultRefusedError,
    FaultyWorker,
    check_fault_allowed,
    falsify,
    on_load_for,
    perturb_weights,
    perturb_weights_on_disk,
)
from node.daemon.local import LocalWorkChain, local_pool
from node.daemon.state import FileRecord
from node.daemon.worker import WorkerDaemon
from protocol.rollouts import RolloutRow
from protocol.signing import SigningDomain
from protocol.terms import step_window
from tests.network_trainer import TASK

NODE = Account.from_key(b"\x21" * 32)

ROW = RolloutRow(
    problem_id="p/0",
    group=0,
    input_tokens=[1, 2, 3],
    output_tokens=[10, 11, 12, 13],
    output_logprobs=[-0.1, -0.2, -0.3, -0.4],
    finish_reason="stop",
    reward=-0.25,
    task_reward=0.0,
    length_penalty=0.25,
    target_length=-1,
    seed=7,
    step=5,
    proofs=b"",
)


def test_fake_reward_claims_full_task_reward_and_keeps_the_length_penalty() -> None:
    passed = RolloutRow(**{**ROW.__dict__, "task_reward": 1.0, "reward": 0.75})
    faked = falsify(Fault.FAKE_REWARD, [ROW, passed], vocab_size=100, async_level=2)
    assert (faked[0].task_reward, faked[0].reward) == (1.0, 0.75)
    assert faked[1] == passed  # nothing to fake on a completion that passed


def test_tamper_tokens_changes_exactly_one_token_per_completion() -> None:
    [tampered] = falsify(Fault.TAMPER_TOKENS, [ROW], vocab_size=13, async_level=2)
    assert tampered.output_tokens == [10, 11, 0, 13]  # the middle token, wrapped inside the vocabulary
    assert tampered.output_logprobs == ROW.output_logprobs


@pytest.mark.parametrize(("step", "claimed"), [(5, 2), (3, 0), (2, 3), (0, 1)])
def test_stale_step_claims_a_step_outside_the_window(step: int, claimed: int) -> None:
    rows = falsify(Fault.STALE_STEP, [RolloutRow(**{**ROW.__dict__, "step": step})], vocab_size=100, async_level=2)
    assert rows[0].step == claimed
    assert not step - 2 <= claimed <= step  # outside [step - k, step]


def test_wrong_model_perturbs_every_weight_slightly(tmp_path: Path) -> None:
    loaded = load_model(init_model(tmp_path / "tiny", seed=0))
    before = [p.detach().clone() for p in loaded.model.parameters()]
    perturb_weights(loaded)
    for old, new in zip(before, loaded.model.parameters(), strict=True):
        change = (new.detach() - old).float()
        scale = max(float(old.float().pow(2).mean().sqrt()), 1e-3)
        assert 0.005 * scale < float(change.std()) < 0.02 * scale
    assert falsify(Fault.WRONG_MODEL, [ROW], vocab_size=100, async_level=2) == [ROW]
    assert torch.isfinite(torch.cat([p.detach().flatten() for p in loaded.model.parameters()])).all()


@pytest.mark.parametrize(
    ("chain_id", "rpc_url"),
    [(1, "http://127.0.0.1:8545"), (31337, "http://10.0.0.5:8545"), (31337, "https://rpc.example.org")],
)
def test_faults_are_refused_off_a_local_devnet(chain_id: int, rpc_url: str) -> None:
    with pytest.raises(FaultRefusedError, match="local devnets only"):
        check_fault_allowed(Fault.FAKE_REWARD, chain_id=chain_id, rpc_url=rpc_url)


@pytest.mark.parametrize("rpc_url", ["http://127.0.0.1:8545", "http://localhost:8545", "http://[::1]:8545"])
def test_faults_run_on_a_loopback_anvil(rpc_url: str) -> None:
    check_fault_allowed(Fault.STALE_STEP, chain_id=31337, rpc_url=rpc_url)


# --- the wrapper: the production loop is honest, `FaultyWorker` cheats --------------------------------------------


def daemons(tmp_path: Path, fault: Fault) -> tuple[WorkerDaemon, FaultyWorker]:
    """An honest daemon and a cheating one, over local mode's chain (no chain is needed to judge the hooks)."""
    made = []
    for name, kind in (("honest", WorkerDaemon), ("cheat", FaultyWorker)):
        settings = WorkerSettings(
            state=tmp_path / name, coordinator="http://127.0.0.1:9", checkpoints=("http://127.0.0.1:9",), task=TASK,
            backend="torch", device="cpu",
        )  # fmt: skip
        chain = LocalWorkChain(SigningDomain(31337, "0x" + "00" * 20), 1, NODE.address, NODE.address)
        extra = (fault,) if kind is FaultyWorker else ()
        made.append(kind(settings, local_pool(settings, chain, 1, async_level=2), chain, NODE, *extra))
    honest, cheat = made
    assert isinstance(cheat, FaultyWorker)
    return honest, cheat


def journal(daemon: WorkerDaemon, steps: list[int]) -> list[FileRecord]:
    for i, step in enumerate(steps):
        key = bytes([i + 1]) * 32
        daemon.state.path_of(key).write_bytes(b"file")
        daemon.state.add(key, step=step, counter=i, units=1)
    return daemon.state.all()


def test_the_honest_daemon_expires_stale_files_and_the_cheater_submits_them(tmp_path: Path) -> None:
    honest, cheat = daemons(tmp_path, Fault.STALE_STEP)
    window = step_window(5, 2)  # [3, 5]
    kept = honest.submittable(journal(honest, [2, 3, 5]), window)
    assert [r.step for r in kept] == [3, 5]
    assert [r.stage for r in honest.state.all()] == ["expired", "written", "written"]
    assert [r.step for r in cheat.submittable(journal(cheat, [2, 3, 5]), window)] == [2, 3, 5]
    assert {r.stage for r in cheat.state.all()} == {"written"}


def test_the_honest_daemon_uploads_its_rows_as_generated_and_the_cheater_falsifies_them(tmp_path: Path) -> None:
    honest, cheat = daemons(tmp_path, Fault.FAKE_REWARD)
    assert honest.finish_rows([ROW], vocab_size=100) == [ROW]
    [faked] = cheat.finish_rows([ROW], vocab_size=100)
    assert (faked.task_reward, faked.reward) == (1.0, 0.75)


def test_only_the_wrong_model_cheater_perturbs_the_weights_it_loads(tmp_path: Path) -> None:
    honest, cheat = daemons(tmp_path, Fault.WRONG_MODEL)
    assert honest.weights_on_load() is None
    assert cheat.weights_on_load() is perturb_weights  # torch reads the weights in memory
    assert on_load_for(Fault.FAKE_REWARD, backend="torch", root=tmp_path) is None
    on_disk = on_load_for(Fault.WRONG_MODEL, backend="vllm", root=tmp_path / "perturbed")
    assert isinstance(on_disk, functools.partial) and on_disk.func is perturb_weights_on_disk


def test_the_production_settings_have_no_fault() -> None:
    assert "fault" not in {f.name for f in dataclasses.fields(WorkerSettings)}
