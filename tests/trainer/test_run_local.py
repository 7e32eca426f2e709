"""`prime-train run` in local mode, as processes: the coordinator, the origin, workers (the worker daemon over
`node.daemon.local`'s chain that is not there), the async window, resume,
and the keys (encrypted keystores; an older run's plaintext key is migrated; the password reaches the workers
through their environment, never their command line).

The model is the random tiny one: its rewards are all 0, so every group is dropped and the weights stay put;
what these tests check is the loop around the learner (the learner's own update is tested in test_learner.py,
learning itself in tests/trainer/test_learning_short.py and benchmarks/learning.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from engine.model.loading import load_model
from engine.model.tiny import init_model
from ledger.accounts import PASSWORD_ENV_VAR, load_account
from protocol.coordinator.client import CoordinatorClient
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from shardcast.client import new_session
from tests.network_trainer import TASK, trainer_toml
from tests.trainer.rollout_factory import make_file
from trainer.run import LOCAL_DOMAIN, LOCAL_POOL_ID

PASSWORD = "run-local-test-password"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("run") / "tiny", seed=0)


def write_config(path: Path, model: Path, *, steps: int, async_level: int = 1, rollouts: int = 32) -> Path:
    path.write_text(
        trainer_toml(
            model,
            steps=steps,
            async_level=async_level,
            rollouts_per_step=rollouts,
            coordinator={"port": 0, "prompts_per_task": 4, "group_size": 4},
            shardcast={"port": 0, "keep": async_level + 2},
            local={"workers": 2},
        )
    )
    return path


def start(config: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "run", "--config", str(config), *extra],
        cwd=config.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its workers share its process group, so a test can kill them all
        env=os.environ | {"OMP_NUM_THREADS": "1", PASSWORD_ENV_VAR: PASSWORD},
    )


def keystores(run: Path) -> dict[str, Path]:
    """The keys folder by role: each a private v3 keystore, and no plaintext key left."""
    found = {}
    for path in sorted((run / "keys").iterdir()):
        assert path.suffix == ".json", f"not a keystore: {path.name}"
        assert "crypto" in json.loads(path.read_text()), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        found[path.name.split("--")[0]] = path
    return found


def worker_command_lines(trainer: subprocess.Popen[str]) -> list[list[str]]:
    children = psutil.Process(trainer.pid).children()
    return [c.cmdline() for c in children if "node.daemon.local" in c.cmdline()]  # the worker daemon, local mode


def records(run: Path, name: str) -> list[dict[str, object]]:
    path = run / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def finish(process: subprocess.Popen[str], timeout: float = 240) -> tuple[str, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"prime-train run did not finish:\n{err[-3000:]}") from None
    assert process.returncode == 0, err[-3000:]
    return out, err


def test_local_mode_trains_inside_the_async_window_and_refuses_a_stale_upload(tmp_path: Path, model_dir: Path) -> None:
    config = write_config(tmp_path / "trainer.toml", model_dir, steps=6, async_level=2)
    run = tmp_path / "run"
    late, account = old_file(tmp_path, model_dir, run)
    process = start(config)
    try:
        deadline = time.monotonic() + 180
        while len(records(run, "metrics.jsonl")) < 3:  # policy step 3 exists: step 0 is outside [1, 3]
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no third step in time"
            time.sleep(0.2)
        commands = worker_command_lines(process)
        stale = upload(run, account, late)  # accepted: worker 0 kept its address through the migration
        out, err = finish(process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    made = keystores(run)
    assert sorted(made) == ["trainer", "worker-0", "worker-1"]
    assert load_account(made["worker-0"], PASSWORD).address == account.address
    assert len(commands) == 2
    for command in commands:
        assert "--keystore" in command and "--key-file" not in command
        assert not any(PASSWORD in part for part in command)
    assert "deleted the plaintext key" in err and PASSWORD not in out + err
    metrics = records(run, "metrics.jsonl")
    trained = records(run, "trained.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    for record in metrics:  # step s + 1 was trained at policy s on files from s - 2 .. s
        trained_at = int(record["step"]) - 1  # type: ignore[call-overload]
        assert trained_at - 2 <= int(record["oldest_policy_step"]) <= trained_at  # type: ignore[call-overload]
        assert float(record["idle_seconds"]) >= 0  # type: ignore[arg-type]
    keys = [k for t in trained for k in t["work_keys"]]  # type: ignore[attr-defined]
    assert len(keys) == len(set(keys)), "a file was trained on twice"
    assert "0x" + stale.hex() not in keys
    assert int(metrics[-1]["stale_files_total"]) >= 1  # type: ignore[call-overload]
    assert "idle" in out and "waiting for data" in out
    # the coordinator served the workers' checkpoints: every worker log shows uploads for several steps
    for log in (run / "logs").glob("worker-*.log"):
        assert "uploaded" in log.read_text() and PASSWORD not in log.read_text()
    # each worker journaled its files in its state folder, as the worker daemon does: uploaded ones as submitted
    for state in (run / "workers").iterdir():
        journal = sqlite3.connect(state / "state.db")
        stages = dict(journal.execute("SELECT stage, COUNT(*) FROM files GROUP BY stage").fetchall())
        journal.close()
        assert stages.get("submitted", 0) > 0 and not {"invalidated", "claimed"} & set(stages), stages


def old_file(tmp_path: Path, model_dir: Path, run: Path) -> tuple[Path, LocalAccount]:
    """A file of worker 0 claiming policy step 0. Its key is made first, as a plaintext file of a run from before
    the keystores: the run migrates it into worker 0's keystore and keeps its address."""
    account = Account.create()
    (run / "keys").mkdir(parents=True)
    (run / "keys" / "worker-0.key").write_text(account.key.hex().removeprefix("0x") + "\n")
    spec = load_task_spec(TASK)
    path = make_file(
        tmp_path / "late.parquet",
        load_model(model_dir),
        spec,
        open_source(spec),
        step=0,
        counter=10_000,
        node=account.address,
        pool_id=LOCAL_POOL_ID,
    )
    return path, account


def upload(run: Path, account: LocalAccount, path: Path) -> bytes:
    """Uploads `path` as `account` to the running coordinator; returns its work key."""

    async def put() -> bytes:
        async with new_session() as session:
            client = CoordinatorClient(session, coordinator_url(run), account, LOCAL_DOMAIN)
            data = path.read_bytes()
            answer = await client.upload(hashlib.sha256(data).digest(), data)
            assert answer.created
            return answer.work_key

    return asyncio.run(put())


def coordinator_url(run: Path) -> str:
    return str(json.loads((run / "endpoints.json").read_text())["coordinator"])


def test_a_killed_trainer_resumes_from_its_last_state_and_trains_no_file_twice(tmp_path: Path, model_dir: Path) -> None:
    config = write_config(tmp_path / "trainer.toml", model_dir, steps=5)
    run = tmp_path / "run"
    process = start(config)
    try:
        deadline = time.monotonic() + 180
        while not (run / "state" / "step_2.pt").exists():
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no state for step 2 in time"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)  # the trainer and its workers, mid-step 3 at the latest
        process.wait()
        before = records(run, "metrics.jsonl")
        identity = json.loads((run / "endpoints.json").read_text())["trainer"], keystores(run)
        saved = max(int(p.stem.removeprefix("step_")) for p in (run / "state").glob("step_*.pt"))
        restarted = start(config)
        finish(restarted)
    finally:
        for p in (process, locals().get("restarted")):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    after = records(run, "metrics.jsonl")
    steps = [int(m["step"]) for m in after]  # type: ignore[call-overload]
    assert steps[: len(before)] == [int(m["step"]) for m in before]  # type: ignore[call-overload]
    assert steps[len(before) :] == list(range(saved + 1, 6)), "the restart did not continue from the saved state"
    keys = [k for t in records(run, "trained.jsonl") for k in t["work_keys"]]  # type: ignore[attr-defined]
    assert len(keys) == len(set(keys)), "a file was trained on twice across the restart"
    # the restart decrypted the same keystores: same trainer, same workers, no new key
    assert (json.loads((run / "endpoints.json").read_text())["trainer"], keystores(run)) == identity
