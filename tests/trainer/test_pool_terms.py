"""The trainer follows the pool's terms (protocol.terms) in network mode: what trainer.toml leaves out it takes from the
pool, what contradicts the pool it refuses, naming the key, before it serves anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger.client import Ledger
from ledger.deployment import Deployment
from protocol.tasks.spec import load_task_spec, spec_hash
from protocol.terms import MAX_ASYNC_LEVEL, MAX_FILE_BYTES, MAX_REPLICATION, MIN_FILE_BYTES, PoolTerms
from tests.ledger.helpers import make_pool
from tests.network_trainer import TASK, write_trainer_config
from trainer.cli import app
from trainer.config import TrainerConfigError, load_run_config

TRAINER = "0x" + "11" * 20
NETWORK = f"[run]\ndir='r'\nmodel='m'\ntask='{TASK}'\n[pool]\nid=4\ndeployment='d.json'\n"


def terms(**fields: object) -> PoolTerms:
    base: dict[str, object] = dict(
        pool_id=4, trainer=TRAINER, challenge_window=3600, max_units_per_key=1, spec_uri="file:///pool.toml"
    )
    return PoolTerms(**(base | fields))  # type: ignore[arg-type]


def test_settings_left_out_take_the_pools_terms(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(NETWORK)
    config = load_run_config(path, terms=terms(async_level=3, max_file_bytes=1 << 20, prompts_per_task=4))
    assert (config.learner.async_level, config.api.async_level) == (3, 3)  # what the loop and the quota count with
    assert (config.api.max_upload_bytes, config.api.prompts_per_task, config.api.group_size) == (1 << 20, 4, 8)


def test_every_term_the_pool_may_declare_is_one_the_trainer_takes(tmp_path: Path) -> None:
    """One bound per term (issue 34): the trainer capped the async level at 64 where the pool's terms allowed 65,536,
    so a spec saying 65 made `prime-train run` refuse a key its TOML never set; now the terms refuse 65 themselves.
    And the trainer took uploads no smaller than 1,024 bytes where the terms allowed 1."""
    path = tmp_path / "trainer.toml"
    path.write_text(NETWORK)
    widest = terms(
        async_level=MAX_ASYNC_LEVEL,
        assignment_lifetime=3600,
        max_file_bytes=MAX_FILE_BYTES,
        replication=MAX_REPLICATION,
    )
    config = load_run_config(path, terms=widest)
    assert (config.learner.async_level, config.api.max_upload_bytes) == (MAX_ASYNC_LEVEL, MAX_FILE_BYTES)
    assert load_run_config(path, terms=terms(max_file_bytes=MIN_FILE_BYTES)).api.max_upload_bytes == MIN_FILE_BYTES
    with pytest.raises(ValueError, match=r"max_file_bytes must be in \[1024, "):
        terms(max_file_bytes=MIN_FILE_BYTES - 1)
    with pytest.raises(ValueError, match=r"async_level must be in \[0, 64\], got 65"):
        terms(async_level=MAX_ASYNC_LEVEL + 1)
    path.write_text(NETWORK + f"min_attestations = {MAX_REPLICATION}\n")
    assert load_run_config(path, terms=widest).pool is not None


@pytest.mark.parametrize(
    ("extra", "pool", "message"),
    [
        (
            "[data]\nasync_level = 1\n",
            {"async_level": 2},
            "data.async_level is 1, but pool 4's spec file:///pool.toml says 2",
        ),
        (
            "[coordinator]\nmax_upload_bytes = 4096\n",
            {},
            "coordinator.max_upload_bytes is 4096, but pool 4's spec .* says 67108864",
        ),
        ("[coordinator]\ngroup_size = 4\n", {"group_size": 16}, "coordinator.group_size is 4, but pool 4's .* says 16"),
        # validators split the keys: with one checking each, a file never gets two acceptances
        ("", {"replication": 1}, r"pool.min_attestations is 2, but pool 4's .* checked by 1 validator"),
    ],
)
def test_a_setting_that_contradicts_the_pool_is_refused_by_name(
    tmp_path: Path, extra: str, pool: dict[str, object], message: str
) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(NETWORK + ("min_attestations = 2\n" if "replication" in pool else "") + extra)
    load_run_config(path)  # alone, the file is fine: only the pool's terms contradict it
    with pytest.raises(TrainerConfigError, match=message):
        load_run_config(path, terms=terms(**pool))


def test_a_task_that_is_not_the_pools_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text(TASK.read_text().replace("basic-arithmetic", "another-task", 1))
    path = tmp_path / "trainer.toml"
    path.write_text(NETWORK.replace(str(TASK), str(other)))
    with pytest.raises(TrainerConfigError, match=r"run.task: .*other.toml .* is not the task of pool 4's spec"):
        load_run_config(path, terms=terms(task_path=TASK, task_hash=spec_hash(load_task_spec(TASK))))


def test_prime_train_run_refuses_a_pool_whose_async_level_is_not_its_own(
    tmp_path: Path, ledger_for: Callable[[int], Ledger], deployment: Deployment
) -> None:
    """On a chain: the pool's spec says async_level = 2, trainer.toml 1. Validators would accept files the trainer
    then drops as stale, paid for and never trained on: it stops with one line instead, before serving."""
    spec_file = tmp_path / "pool.toml"
    pool_id = make_pool(ledger_for(0), spec_uri=spec_file.as_uri())
    deployment.save(tmp_path / "deployment.json")
    config = write_trainer_config(tmp_path, tmp_path / "no-model", pool_id, steps=1, rollouts_per_step=8,
                                  async_level=2, spec_file=spec_file)  # fmt: skip
    config.write_text(config.read_text().replace("async_level = 2", "async_level = 1"))
    run = ["run", "--config", str(config)]
    result = CliRunner().invoke(app, [*run, "--dev-key", "0"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert f"data.async_level is 1, but pool {pool_id}'s spec {spec_file.as_uri()} says 2" in errors[0]
    assert not (tmp_path / "run").exists()  # nothing served, nothing written
    wrong_key = CliRunner().invoke(app, [*run, "--dev-key", "1"])  # not the pool's trainer: refused first
    assert wrong_key.exit_code == 1 and f"pool {pool_id}'s trainer is" in wrong_key.stderr, wrong_key.output
