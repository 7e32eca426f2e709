"""`prime-train run` under torchrun: two gloo processes train the live loop in local mode like one process, stop
together on SIGTERM, and resume from the saved state under torchrun again.

Local mode's worker samples whenever it gets its turn, so two runs never train on the same files. The comparison is
made fair the other way round: the torchrun run records the work keys of every step (`trained.jsonl`), and one
process trains again on exactly those files, step by step, from the same initial model. The random tiny model earns
no reward of its own, so the inbox is seeded with files whose rewards are mixed (`rollout_factory.make_file`): four
of policy step 0 and two of each later step. Local mode takes the oldest files of the window first, so after the
first step each step trains mostly on the seeded files of the step before it: off-policy, against the kept weights
of the policy that made them. The worker's own files (every reward 0: no loss) take the place of some seeded ones
at random; the recomputation takes the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from engine.model.loading import load_model
from engine.model.tiny import init_model
from ledger.accounts import PASSWORD_ENV_VAR
from protocol.rollouts import read_rollouts
from protocol.rollouts.writer import encode_rollouts
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from tests.network_trainer import TASK, trainer_toml
from tests.trainer.rollout_factory import make_file
from trainer.config import TrainerConfigError, load_run_config
from trainer.distributed import DistributedError
from trainer.errors import TrainerError
from trainer.learner import World
from trainer.loop import TrainingLoop
from trainer.ranks import Control, Decision, follow
from trainer.run import live_loop

ROOT = Path(__file__).parents[2]
SEEDED = [4, 2, 2, 2, 2, 2]  # files of 16 completions waiting in the inbox for policy steps 0, 1, ...
STEPS_FIRST_RUN = 8  # more than it reaches: SIGTERM stops it at the step boundary after state 2 is saved


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, beside a folder named like an inbox holding the SEEDED files.

    Two files are generated; the others are copies whose rows claim their step (and whose assignments differ):
    generating each anew would cost a minute of this test on two cores, and the weights differ at every step anyway.
    """
    root = tmp_path_factory.mktemp("live")
    model_dir = init_model(root / "tiny", seed=0)
    spec = load_task_spec(TASK)
    source, loaded = open_source(spec), load_model(model_dir)
    made = [make_file(root / f"made-{i}.parquet", loaded, spec, source, step=0, counter=i) for i in range(2)]
    inbox = root / "inbox"
    inbox.mkdir()
    for step, count in enumerate(SEEDED):
        for i in range(count):
            file = read_rollouts(made[i % 2], max_bytes=1 << 26)
            meta = dataclasses.replace(file.meta, counter=1000 + 10 * step + i)
            data = encode_rollouts(meta, [dataclasses.replace(row, step=step) for row in file.rows])
            (inbox / f"{hashlib.sha256(data).hexdigest()}.parquet").write_bytes(data)  # as the API stores uploads
    return model_dir


def write_config(root: Path, model_dir: Path, seeded_inbox: Path) -> Path:
    """One local worker, 32 completions a step in micro-batches of 300 tokens, k = 2, on the CPU (the ranks and the
    recomputation alike)."""
    run = root / "run"
    (run / "inbox").mkdir(parents=True)
    for path in seeded_inbox.iterdir():
        (run / "inbox" / path.name).write_bytes(path.read_bytes())
    config = root / "trainer.toml"
    config.write_text(
        trainer_toml(
            model_dir,
            steps=STEPS_FIRST_RUN,
            async_level=2,
            rollouts_per_step=32,
            run={
                "dir": "run",
                "model": str(model_dir),
                "task": str(TASK),
                "steps": STEPS_FIRST_RUN,
                "threads": 1,
                "device": "cpu",
            },
            optim={"micro_batch_tokens": 300},  # several micro-batches a step, dealt out to the ranks
            coordinator={"port": 0, "prompts_per_task": 4, "group_size": 4},
            shardcast={"port": 0, "keep": 4},
            local={"workers": 1},
        )
    )
    return config


def torchrun(config: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return subprocess.Popen(
        [*command, "-m", "trainer.cli", "run", "--config", str(config), "--json", *extra],
        cwd=config.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # SIGTERM to its group reaches torchrun, which forwards it to every rank
        env=os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", PASSWORD_ENV_VAR: "live-pw"},
    )


def wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()[1][-4000:]
        assert time.monotonic() < deadline, f"no {path.name} in time"
        time.sleep(0.05)


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def saved_steps(run: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("step_")) for p in (run / "state").glob("step_*.pt"))


@pytest.mark.slow
def test_two_ranks_train_the_live_loop_like_one_process_stop_on_sigterm_and_resume(
    tmp_path: Path, seeded: Path
) -> None:
    model_dir = seeded
    config = write_config(tmp_path, model_dir, model_dir.parent / "inbox")
    run = tmp_path / "run"

    first = torchrun(config)
    try:
        wait_for(run / "state" / "step_2.pt", first)
        family = psutil.Process(first.pid).children(recursive=True)  # two ranks, and the worker rank 0 started
        commands = [" ".join(p.cmdline()) for p in family]
        os.killpg(first.pid, signal.SIGTERM)
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert sum("node.daemon.local" in command for command in commands) == 1, "rank 0 alone starts local workers"
    assert "SIGTERM: stopping" in err and "rank 1: SIGTERM, stopping when rank 0 does" in err, err[-4000:]
    assert not [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "left running"
    stopped_at = saved_steps(run)[-1]
    assert stopped_at >= 2
    assert [r["step"] for r in lines(run / "metrics.jsonl")] == list(range(1, stopped_at + 1))  # a whole last step
    at_stop = load_file(run / "checkpoints" / f"step_{stopped_at}" / "model.safetensors")

    second = torchrun(config, "--steps", str(stopped_at + 2))
    out, err = second.communicate(timeout=150)
    assert second.returncode == 0, err[-4000:]
    summary = json.loads(out)  # rank 0 alone prints
    assert (summary["start_step"], summary["final_step"]) == (stopped_at, stopped_at + 2)
    assert err.count(f"resumed from {run / 'state' / f'step_{stopped_at}.pt'}") == 2  # both ranks loaded it

    metrics = {int(r["step"]): r for r in lines(run / "metrics.jsonl")}  # type: ignore[call-overload]
    trained = lines(run / "trained.jsonl")
    assert [t["step"] for t in trained] == list(range(1, stopped_at + 3))
    # one process, the same model and settings, trained on exactly the files each step of the torchrun run took
    one = live_loop(load_run_config(config, flags={"run.dir": tmp_path / "one"}), World())
    for entry in trained:
        files = [one.read(run / "inbox" / f"{key[2:]}.parquet", bytes.fromhex(key[2:])) for key in entry["work_keys"]]  # type: ignore[attr-defined]
        stats = one.learner.train_step(files)
        expected = {k: math.nan if v is None else v for k, v in metrics[stats.step].items()}  # None: no loss
        assert stats.step > 1 or math.isfinite(expected["loss"]), "the first step trains on seeded files alone"
        assert stats.loss == pytest.approx(expected["loss"], rel=1e-4, nan_ok=True), stats.step
        assert stats.grad_norm == pytest.approx(expected["grad_norm"], rel=1e-4, nan_ok=True), stats.step
        assert stats.mean_ratio == pytest.approx(expected["mean_ratio"], rel=1e-5, nan_ok=True), stats.step
        assert stats.trained_tokens == expected["trained_tokens"]
        if stats.step == stopped_at:  # the weights the first run stopped with, which the second resumed
            assert_weights(one, at_stop, atol=2e-5)
    assert_weights(one, load_file(run / "checkpoints" / f"step_{stopped_at + 2}" / "model.safetensors"), atol=2e-5)


def assert_weights(loop: TrainingLoop, checkpoint: dict[str, torch.Tensor], *, atol: float) -> None:
    state = loop.learner.model.state_dict()
    for name, tensor in checkpoint.items():  # Adam magnifies rounding of tiny gradients (see test_learner)
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=atol, msg=name)


class ScriptedControl(Control):
    """Rank 1's side of the control group without one: the decisions rank 0 would send, in order."""

    def __init__(self, decisions: list[Decision]) -> None:
        self.world = World(1, 2)
        self.decisions = decisions

    def receive(self) -> Decision:
        return self.decisions.pop(0)


@pytest.fixture
def loop(tmp_path: Path, seeded: Path) -> TrainingLoop:
    model_dir = seeded
    return live_loop(load_run_config(write_config(tmp_path, model_dir, model_dir.parent / "inbox")), World())


def test_a_follower_trains_the_files_rank_0_names_and_stops_when_told(loop: TrainingLoop, seeded: Path) -> None:
    inbox = loop.paths.root / "inbox"
    chosen = loop.select(sorted(inbox.glob("*.parquet")))
    files = tuple((str(p), f.work_key) for p, f in zip(chosen.paths, chosen.files, strict=True))
    control = ScriptedControl([Decision("wait", 0), Decision("train", 0, files, 1.5), Decision("stop", 1)])
    assert follow(loop, control) == 1
    assert loop.learner.step == 1 and not control.decisions
    assert lines(loop.paths.trained) == [{"step": 1, "work_keys": ["0x" + key.hex() for _, key in files]}]


def test_a_follower_out_of_step_or_shown_other_bytes_stops_with_an_error(loop: TrainingLoop) -> None:
    with pytest.raises(DistributedError, match="rank 0 is at policy step 3, rank 1 at 0"):
        follow(loop, ScriptedControl([Decision("wait", 3)]))
    path = next((loop.paths.root / "inbox").glob("*.parquet"))
    with pytest.raises(TrainerError, match="is not the upload 0x00"):
        follow(loop, ScriptedControl([Decision("train", 0, ((str(path), bytes(32)),))]))


def test_held_out_evaluation_is_refused_under_torchrun(tmp_path: Path, seeded: Path) -> None:
    model_dir = seeded
    config = write_config(tmp_path, model_dir, model_dir.parent / "inbox")
    config.write_text(config.read_text() + "[eval]\nevery = 5\n")
    with pytest.raises(TrainerConfigError, match=r"\[eval\] every needs one process"):
        live_loop(load_run_config(config), World(0, 2))
