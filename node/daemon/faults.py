"""`prime-node start --simulate-fault`: a worker that cheats on purpose, so devnets and tests can watch it be slashed.

Each fault is what a real cheater would try, and each is caught by a different check of the validator
(DESIGN section 7):

| fault | what the worker does | caught by |
|---|---|---|
| wrong-model | generates with weights about 1% off the checkpoint (a cheaper model) | TOPLOC proofs (reason 7) |
| tamper-tokens | changes one generated token per completion after sampling | sampling recheck / proofs (5, 7) |
| fake-reward | claims a task reward of 1 for every completion | reward recomputation (6) |
| stale-step | labels its files with a step outside the pool's window | signed assignment (3); offline, step (4) |

Faults are refused on any chain but a local devnet: chain id 31337 with an RPC endpoint on loopback.

`FaultyWorker` is the worker daemon with its honest hooks overridden: the production loop (`node.daemon.worker`)
has no branch for any fault; `prime-node start --simulate-fault` builds this subclass instead.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import shutil
import urllib.parse
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from core.errors import NodeError
from engine.model.loading import LoadedModel
from node.daemon.state import FileRecord
from node.daemon.worker import ServeDashboard, WorkerDaemon
from protocol.rollouts import RolloutRow
from protocol.terms import step_window

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from node.config import WorkerSettings
    from node.daemon.chain import WorkChain
    from protocol.pool_spec import Pool
    from protocol.terms import StepWindow

DEVNET_CHAIN_ID = 31337
WRONG_MODEL_NOISE = 0.01  # relative to each tensor's own scale


class Fault(StrEnum):
    WRONG_MODEL = "wrong-model"
    TAMPER_TOKENS = "tamper-tokens"
    FAKE_REWARD = "fake-reward"
    STALE_STEP = "stale-step"


class FaultRefusedError(NodeError):
    """A simulated fault was asked for on a chain that is not a local devnet, or by a name that is none."""


def parse_fault(name: str | None) -> Fault | None:
    """`--simulate-fault NAME`: None without one; a name that is no fault is refused with the choices."""
    if name is None:
        return None
    try:
        return Fault(name)
    except ValueError:
        raise FaultRefusedError(
            f"--simulate-fault {name!r}: choose one of {', '.join(f.value for f in Fault)}"
        ) from None


def _loopback(rpc_url: str) -> bool:
    host = urllib.parse.urlsplit(rpc_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_fault_allowed(fault: Fault, *, chain_id: int, rpc_url: str) -> None:
    if chain_id != DEVNET_CHAIN_ID or not _loopback(rpc_url):
        raise FaultRefusedError(
            f"--simulate-fault {fault} is for local devnets only (chain id {DEVNET_CHAIN_ID} on a loopback RPC); "
            f"this is chain {chain_id} at {rpc_url}"
        )


def perturb_weights(loaded: LoadedModel, *, seed: int = 0) -> None:
    """wrong-model: adds noise of WRONG_MODEL_NOISE times each tensor's RMS (at least 1e-3), in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in loaded.model.parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32).to(param.dtype)
            scale = max(float(param.float().pow(2).mean().sqrt()), 1e-3)  # norms are all ones, fresh biases zero
            param.add_(noise * WRONG_MODEL_NOISE * scale)


def perturb_weights_on_disk(loaded: LoadedModel, root: Path) -> None:
    """wrong-model for an engine that reads weights from disk (vLLM): the perturbed weights are also written into
    `root`, and `loaded.path` points there. The model hash stays the honest one, as a cheater's would."""
    perturb_weights(loaded)
    target = root / loaded.path.name
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(target)
    loaded.tokenizer.save_pretrained(target)
    loaded.path = target


def falsify(fault: Fault, rows: Sequence[RolloutRow], *, vocab_size: int, async_level: int) -> list[RolloutRow]:
    """The rows a cheater would upload in place of the honest `rows` (wrong-model changes the weights instead)."""
    if fault is Fault.WRONG_MODEL:
        return list(rows)
    if fault is Fault.FAKE_REWARD:
        return [
            dataclasses.replace(r, task_reward=1.0, reward=1.0 - r.length_penalty) if r.task_reward < 1.0 else r
            for r in rows
        ]
    if fault is Fault.TAMPER_TOKENS:
        tampered = []
        for r in rows:
            tokens = list(r.output_tokens)
            middle = len(tokens) // 2
            tokens[middle] = (tokens[middle] + 1) % vocab_size
            tampered.append(dataclasses.replace(r, output_tokens=tokens))
        return tampered
    # stale-step: a step older than the window, or, that early in a run, one the pool has not reached
    step = step_window(rows[0].step, async_level).oldest - 1 if rows else 0
    return [dataclasses.replace(r, step=step if step >= 0 else r.step + 1) for r in rows]


def on_load_for(fault: Fault, *, backend: str, root: Path) -> Callable[[LoadedModel], None] | None:
    """What wrong-model does to each policy loaded (None for the other faults): perturbs it in place, and for vLLM,
    which reads the weights from disk, also writes the perturbed copy under `root`."""
    if fault is not Fault.WRONG_MODEL:
        return None
    return functools.partial(perturb_weights_on_disk, root=root) if backend == "vllm" else perturb_weights


class FaultyWorker(WorkerDaemon):
    """The worker daemon cheating with `fault`: the same loop, with the three honest hooks replaced."""

    def __init__(
        self,
        settings: WorkerSettings,
        pool: Pool,
        chain: WorkChain,
        account: LocalAccount,
        fault: Fault,
        *,
        dashboard: ServeDashboard | None = None,
        memory_budget: int | None = None,
    ) -> None:
        super().__init__(settings, pool, chain, account, dashboard=dashboard, memory_budget=memory_budget)
        self.fault = fault

    def weights_on_load(self) -> Callable[[LoadedModel], None] | None:
        return on_load_for(self.fault, backend=self.choice.backend, root=self.state_dir / "perturbed")

    def finish_rows(self, rows: list[RolloutRow], *, vocab_size: int) -> list[RolloutRow]:
        return falsify(self.fault, rows, vocab_size=vocab_size, async_level=self.terms.async_level)

    def submittable(self, ready: list[FileRecord], window: StepWindow, *, now: float | None = None) -> list[FileRecord]:
        return ready  # stale files too, and late ones: the validators are there to catch them
