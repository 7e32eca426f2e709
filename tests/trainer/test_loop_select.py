"""Which files the step loop reads: an upload a step consumed (trained on, or dropped as stale) is never read again."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from rollout_factory import make_file

from engine.model.loading import load_model
from engine.model.tiny import init_model
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from trainer.inbox import RolloutInbox
from trainer.learner import Learner, LearnerConfig
from trainer.loop import RunPaths, TrainingLoop
from trainer.run import EveryUpload
from trainer.verdicts import VerdictStore

TASK = Path(__file__).parents[2] / "configs" / "tasks" / "default.toml"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("select") / "tiny", seed=0)


def window_loop(model_dir: Path, run: Path, async_level: int) -> TrainingLoop:
    """A loop on the tiny model whose steps take 16 rows (one file of `make_file`), at most 4 files."""
    loaded = load_model(model_dir)
    spec = load_task_spec(TASK)
    learner = Learner(loaded.model, LearnerConfig(async_level=async_level), pad_id=0)
    source = open_source(spec)
    return TrainingLoop(learner, loaded, spec, source, RunPaths(run), rollouts_per_step=16, max_files_per_step=4)


def upload(inbox: RolloutInbox, made: Path) -> Path:
    data = made.read_bytes()
    key = hashlib.sha256(data).digest()
    inbox.put(key, data, "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1")
    return inbox.path(key)


def test_consumed_uploads_are_not_read_again(model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    loop = window_loop(model_dir, tmp_path / "run", async_level=1)
    loaded, spec, source = loop.loaded, loop.spec, loop.source
    inbox = RolloutInbox(tmp_path / "inbox")
    made = tmp_path / "made"
    made.mkdir()
    uploads = EveryUpload()
    look = lambda: loop.select(uploads(inbox, VerdictStore(), loop.counters.consumed))  # noqa: E731
    step_zero = [
        upload(inbox, make_file(made / f"{counter}.parquet", loaded, spec, source, step=0, counter=counter))
        for counter in range(2)
    ]
    spoil = lambda path: path.write_bytes(b"not parquet")  # noqa: E731  (a read of it would fail loudly)
    caplog.set_level(logging.ERROR, logger="trainer.loop")
    first = look()
    trained, late = sorted(step_zero)  # named by work key; of two files of one step the smaller key goes first
    assert [f.work_key.hex() + ".parquet" for f in first.files] == [trained.name]  # 16 rows a file, 16 a step
    loop.train(first.files, idle_seconds=0.0)  # policy 1: the other file of step 0 is still in the window
    spoil(trained)
    fresh = upload(inbox, make_file(made / "fresh.parquet", loaded, spec, source, step=1, counter=2))
    second = look()
    assert [f.meta.counter for f in second.files] == [2]  # the freshest policy first
    loop.train(second.files, idle_seconds=0.0)  # policy 2: step 0 has left the window
    spoil(fresh)
    third = look()
    assert (third.rows, third.stale, loop.counters.stale_files) == (0, 1, 1)
    spoil(late)
    fourth = look()
    assert (fourth.rows, fourth.stale, loop.counters.stale_files) == (0, 0, 1)
    assert "never training on" not in caplog.text


@pytest.mark.parametrize(("order", "taken"), [("freshest", [2, 1]), ("oldest", [0, 1])])
def test_a_step_takes_the_freshest_or_the_oldest_files_of_its_window_first(
    model_dir: Path, tmp_path: Path, order: str, taken: list[int]
) -> None:
    loaded = load_model(model_dir)
    spec = load_task_spec(TASK)
    source = open_source(spec)
    learner = Learner(loaded.model, LearnerConfig(async_level=2), pad_id=0)
    learner.step = 2  # the window holds files of policies 0, 1 and 2
    loop = TrainingLoop(
        learner, loaded, spec, source, RunPaths(tmp_path / "run"), rollouts_per_step=32, max_files_per_step=4,
        order=order,  # type: ignore[arg-type]  # the parametrized str is one of FILE_ORDERS
    )  # fmt: skip
    made = tmp_path / "made"
    made.mkdir()
    paths = [make_file(made / f"{step}.parquet", loaded, spec, source, step=step, counter=step) for step in (1, 0, 2)]
    selection = loop.select(paths)  # 16 rows a file: a step takes two
    assert [f.rows[0].step for f in selection.files] == taken
    assert selection.stale == 0


def test_an_unknown_order_is_refused(model_dir: Path, tmp_path: Path) -> None:
    loaded = load_model(model_dir)
    spec = load_task_spec(TASK)
    with pytest.raises(ValueError, match="order must be one of"):
        TrainingLoop(
            Learner(loaded.model, LearnerConfig(), pad_id=0), loaded, spec, open_source(spec), RunPaths(tmp_path),
            rollouts_per_step=1, max_files_per_step=1, order="newest",  # type: ignore[arg-type]
        )  # fmt: skip


def test_one_assignment_is_trained_on_once_whatever_files_claim_it(model_dir: Path, tmp_path: Path) -> None:
    """Two files under one (node, counter) — the same job re-encoded with another `created_by` — are one piece of
    work: a step takes one of them, and after training neither is taken again, also after a restart."""
    import dataclasses

    from protocol.rollouts import encode_rollouts, read_rollouts

    loaded = load_model(model_dir)
    spec = load_task_spec(TASK)
    source = open_source(spec)

    def new_loop() -> TrainingLoop:
        learner = Learner(load_model(model_dir).model, LearnerConfig(async_level=1), pad_id=0)
        return TrainingLoop(
            learner, loaded, spec, source, RunPaths(tmp_path / "run"), rollouts_per_step=64, max_files_per_step=4
        )

    loop = new_loop()
    inbox = RolloutInbox(tmp_path / "inbox")
    made = tmp_path / "made"
    made.mkdir()
    original = make_file(made / "a.parquet", loaded, spec, source, step=0, counter=5)
    file = read_rollouts(original, max_bytes=1 << 26)
    copy = made / "b.parquet"
    copy.write_bytes(encode_rollouts(dataclasses.replace(file.meta, created_by="prime-node again"), file.rows))
    other = make_file(made / "c.parquet", loaded, spec, source, step=0, counter=6)
    paths = [upload(inbox, p) for p in (original, copy, other)]
    chosen = loop.select(paths)
    assert sorted(f.meta.counter for f in chosen.files) == [5, 6]  # one file of counter 5, not both
    loop.train(chosen.files, idle_seconds=0.0)
    assert loop.select(paths).files == []
    loop.save_state()
    restarted = new_loop()
    assert restarted.resume()
    assert (file.meta.node, 5) in restarted.counters.assignments
    assert restarted.select(paths).files == []


def test_a_waiting_file_is_read_whole_only_when_chosen_and_only_as_the_bytes_it_was_inspected_as(
    model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`select` keeps a summary of each file waiting in the window and reads the rows of the files it chooses: a
    waiting file whose bytes were replaced meanwhile (another valid file, or garbage) is never trained on."""
    loop = window_loop(model_dir, tmp_path / "run", async_level=2)
    loaded, spec, source = loop.loaded, loop.spec, loop.source
    made = tmp_path / "made"
    made.mkdir()
    waiting = [make_file(made / f"{c}.parquet", loaded, spec, source, step=0, counter=c) for c in range(3)]
    # 16 rows a file: one file a step, the other two wait; within a step the loop takes the lowest work key first
    by_key = sorted(waiting, key=lambda p: hashlib.sha256(p.read_bytes()).digest())
    first = loop.select(waiting)
    assert first.paths == [by_key[0]]
    assert [f.work_key for f in first.files] == [hashlib.sha256(by_key[0].read_bytes()).digest()]
    loop.train(first.files, idle_seconds=0.0)
    other = make_file(made / "other.parquet", loaded, spec, source, step=0, counter=9)
    by_key[1].write_bytes(other.read_bytes())  # a valid file, but not the bytes inspected
    by_key[2].write_bytes(b"not parquet")
    caplog.set_level(logging.ERROR, logger="trainer.loop")
    assert loop.select(waiting).files == []
    assert "its bytes changed after it was inspected" in caplog.text
    assert caplog.text.count("never training on") == 2
    caplog.clear()
    assert loop.select(waiting).files == []  # refused once, never read again
    assert caplog.text == ""
