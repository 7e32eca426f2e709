"""Simulated faults: each falsifies what a real cheater would, and none runs outside a local devnet."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from node.daemon.faults import Fault, FaultRefusedError, check_fault_allowed, falsify, perturb_weights
from node.model.loading import load_model
from node.model.tiny import init_model
from node.rollouts import RolloutRow

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
