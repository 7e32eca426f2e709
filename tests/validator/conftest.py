"""Fixtures of the validator tests: three tiny models, the default task, and helpers to generate and verify files.

Models (made once per session): `m0` (init seed 0) is the pool's checkpoint; `m1` (seed 1) is another model;
`m0_step` is m0 after one more AdamW step (lr 1e-3), the "one-step-stale policy" a lazy worker might serve.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.generate import Generated, generate_rollouts
from engine.inference.torch_backend import TorchBackend
from engine.model.loading import LoadedModel, load_model
from engine.model.tiny import init_model, save_model_dir
from ledger.accounts import dev_account
from ledger.client import Ledger
from protocol.plan import Job
from protocol.tasks.sources import TaskSource, open_source
from protocol.tasks.spec import TaskSpec, load_task_spec
from tests.conftest import TOKEN
from tests.ledger.helpers import make_pool, onboard
from validator.config import ValidatorConfig
from validator.verdict import Verdict
from validator.verify import Expected, verify_file

DEFAULT_TASK = Path(__file__).resolve().parents[2] / "configs" / "tasks" / "default.toml"
NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread() -> Iterator[None]:
    """One intra-op thread: the tiny model's matmuls gain nothing from more, and on a 2-core machine shared
    with other jobs, spinning worker threads made generation 6x slower (measured: 0.28 s against 1.73 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _one_training_step(source: Path, out: Path) -> None:
    """m0 after one AdamW step (lr 1e-3) of next-token cross-entropy on a fixed random batch."""
    loaded = load_model(source)
    model = loaded.model.train()
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, loaded.vocab_size, (8, 48), generator=generator)  # (B, T)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    save_model_dir(model.eval(), loaded.tokenizer, out)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("validator-models")
    dirs = {"m0": init_model(root / "m0", seed=0), "m1": init_model(root / "m1", seed=1)}
    _one_training_step(dirs["m0"], root / "m0_step")
    dirs["m0_step"] = root / "m0_step"
    yield dirs
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def task_spec() -> TaskSpec:
    return load_task_spec(DEFAULT_TASK)


@pytest.fixture(scope="session")
def task_source(task_spec: TaskSpec) -> TaskSource:
    return open_source(task_spec)


@pytest.fixture(scope="session")
def checkpoint(model_dirs: dict[str, Path]) -> LoadedModel:
    """The validator's own copy of the pool's checkpoint."""
    return load_model(model_dirs["m0"])


@pytest.fixture(scope="session")
def worker_models(model_dirs: dict[str, Path]) -> dict[str, LoadedModel]:
    """The workers' copies, loaded apart from the validator's."""
    return {name: load_model(path) for name, path in model_dirs.items()}


@pytest.fixture(scope="session")
def generate(
    task_spec: TaskSpec, task_source: TaskSource, worker_models: dict[str, LoadedModel]
) -> Callable[..., Generated]:
    """generate(counter=, prompts=, group=, batch_size=16, step=0, pool=0, node=NODE, model="m0", spec=None)."""

    def run(
        *,
        counter: int,
        prompts: int,
        group: int,
        batch_size: int = 16,
        step: int = 0,
        pool: int = 0,
        node: str = NODE,
        model: str = "m0",
        spec: TaskSpec | None = None,
    ) -> Generated:
        loaded = worker_models[model]
        backend = TorchBackend.from_loaded(loaded, max_batch_size=batch_size)
        job = Job(pool_id=pool, node=node, step=step, counter=counter, prompts=prompts, group_size=group)
        return generate_rollouts(job, spec or task_spec, task_source, loaded, backend)

    return run


@pytest.fixture(scope="session")
def verify(task_spec: TaskSpec, task_source: TaskSource, checkpoint: LoadedModel) -> Callable[..., Verdict]:
    """verify(data, config=None, **Expected fields) with the m0 checkpoint and the default task."""

    def run(data: bytes, config: ValidatorConfig | None = None, **expected: Any) -> Verdict:
        return verify_file(
            data,
            spec=task_spec,
            checkpoint=checkpoint,
            config=config,
            expected=Expected(**expected),
            source=task_source,
        )

    return run


@pytest.fixture
def pool(ledger_for: Callable[[int], Ledger]) -> tuple[int, Ledger]:
    """A funded pool (window 3600 s, slash 50 tokens) with anvil account 9 as its validator and one node, anvil
    account 6 of provider 1 (the chain tests' accounts: 0 owns the pool); (pool id, the node's client)."""
    owner = ledger_for(0)
    pool_id = make_pool(owner)
    owner.set_validator(pool_id, dev_account(9).address)
    owner.mint(owner.address, 100 * TOKEN)
    owner.fund_rewards(pool_id, 100 * TOKEN)
    node = onboard(owner, ledger_for(1), dev_account(6), pool_id)
    return pool_id, node
