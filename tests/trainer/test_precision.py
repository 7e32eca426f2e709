"""Device and compute dtype of the trainer: the resolver, a real bfloat16 learner step, trainer.toml and the flags."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from engine.model.loading import LoadedModel, load_model
from protocol.rollouts import RolloutFile, read_rollouts
from protocol.tasks.sources import TaskSource
from protocol.tasks.spec import TaskSpec
from tests.trainer.rollout_factory import make_file
from trainer.cli import app
from trainer.config import TrainerConfigError, load_run_config
from trainer.distributed import init_distributed
from trainer.grpo import GRPOConfig
from trainer.learner import Learner, LearnerConfig, LearnerError, StepStats
from trainer.loop import RunPaths, TrainingLoop
from trainer.precision import Precision, PrecisionError, resolve_precision

ROOT = Path(__file__).parents[2]
DEFAULT_TASK = ROOT / "configs" / "tasks" / "default.toml"
NO_CUDA = not torch.cuda.is_available()
LOCAL = "[run]\ndir='r'\nmodel='m'\ntask='t'\n[local]\nworkers=1\n"


# --- the resolver -----------------------------------------------------------------------------------


def test_auto_without_cuda_trains_on_the_cpu_in_float32() -> None:
    precision = resolve_precision("auto", "auto", cuda=False)
    assert (precision.device, precision.dtype) == (torch.device("cpu"), torch.float32)
    assert precision.describe().startswith("training on cpu in float32: no CUDA GPU")


def test_auto_with_cuda_computes_in_bfloat16_on_the_gpu() -> None:
    precision = resolve_precision("auto", "auto", cuda=True)
    assert (precision.device.type, precision.dtype) == ("cuda", torch.bfloat16)
    assert "stay float32" in precision.describe()
    assert resolve_precision("auto", "float32", cuda=True).dtype == torch.float32
    assert resolve_precision("cpu", "auto", cuda=True).device == torch.device("cpu")  # a GPU left alone


def test_cuda_without_a_gpu_is_an_error_not_a_fallback() -> None:
    with pytest.raises(PrecisionError, match=r"device cuda asked for, but torch sees no CUDA GPU"):
        resolve_precision("cuda", "auto", cuda=False)
    if NO_CUDA:  # this machine, as torch sees it
        with pytest.raises(PrecisionError, match="no CUDA GPU"):
            resolve_precision("cuda")
        assert resolve_precision().device == torch.device("cpu")


def test_the_process_group_takes_the_same_device_setting() -> None:
    assert init_distributed({}, device="cpu").size == 1  # cpu: gloo under torchrun, no rank takes a GPU
    with pytest.raises(PrecisionError, match="device must be one of"):
        init_distributed({}, device="gpu")
    if NO_CUDA:
        with pytest.raises(PrecisionError, match="no CUDA GPU"):
            init_distributed({"WORLD_SIZE": "2"}, device="cuda")  # before joining anything


@pytest.mark.parametrize(
    ("device", "dtype", "message"),
    [
        ("gpu", "auto", "device must be one of auto, cpu, cuda, got 'gpu'"),
        ("cpu", "fp16", "dtype must be one of auto, float32, bfloat16, got 'fp16'"),
        ("cpu", "float16", "dtype must be one of"),
    ],
)
def test_unknown_values_are_refused_with_the_setting_named(device: str, dtype: str, message: str) -> None:
    with pytest.raises(PrecisionError, match=message):
        resolve_precision(device, dtype, cuda=False)


def test_bfloat16_autocasts_and_float32_does_not() -> None:
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with resolve_precision("cpu", "bfloat16").autocast():
        assert layer(x).dtype == torch.bfloat16
    with resolve_precision("cpu", "float32").autocast():
        assert layer(x).dtype == torch.float32
    assert layer.weight.dtype == torch.float32


# --- a real learner step ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, task: tuple[TaskSpec, TaskSource]
) -> list[RolloutFile]:
    """Two files of policy step 0 from the initial weights."""
    root = tmp_path_factory.mktemp("files")
    loaded = load_model(model_dir)
    paths = [make_file(root / f"{n}.parquet", loaded, *task, step=0, counter=n) for n in range(2)]
    return [read_rollouts(p, max_bytes=1 << 24) for p in paths]


def learner_on(loaded: LoadedModel, precision: Precision) -> Learner:
    # entropy_coef > 0: the entropy (of the compute dtype's logits) is part of the loss and of the stats
    config = LearnerConfig(lr=1e-3, warmup_steps=0, async_level=1, loss=GRPOConfig(entropy_coef=0.01))
    return Learner(loaded.model, config, pad_id=loaded.tokenizer.pad_token_id or 0, precision=precision)


def two_steps(model_dir: Path, files: list[RolloutFile], precision: Precision) -> tuple[Learner, list[StepStats]]:
    """Step 1 on-policy, step 2 on a step-0 file at policy 1: its ratio is against policy 0's log-probs."""
    torch.manual_seed(0)
    loaded = load_model(model_dir, device=precision.device)
    learner = learner_on(loaded, precision)
    return learner, [learner.train_step([files[0]]), learner.train_step([files[1]])]


def test_a_bfloat16_step_on_the_cpu_trains_float32_weights_with_a_loss_close_to_float32(
    model_dir: Path, files: list[RolloutFile]
) -> None:
    initial = load_file(model_dir / "model.safetensors")
    exact_learner, exact = two_steps(model_dir, files, resolve_precision("cpu", "float32"))
    bf16 = resolve_precision("cpu", "bfloat16")
    learner, low = two_steps(model_dir, files, bf16)

    for stats, reference in zip(low, exact, strict=True):
        assert torch.isfinite(torch.tensor([stats.loss, stats.grad_norm, stats.entropy])).all()
        # measured: loss to 2e-4 relative, ratio to 2e-5, entropy to 2e-6; bfloat16 keeps 3 significant digits
        assert stats.loss == pytest.approx(reference.loss, rel=1e-2, abs=1e-3)
        assert stats.entropy == pytest.approx(reference.entropy, rel=1e-2)
        assert stats.mean_ratio == pytest.approx(reference.mean_ratio, abs=1e-3)
        assert stats.grad_norm == pytest.approx(reference.grad_norm, rel=5e-2)
    assert low[1].entropy != exact[1].entropy  # not the float32 computation under another name
    assert abs(low[1].mean_ratio - 1) > 1e-4  # the off-policy step's ratio is a real one

    for name, param in learner.model.named_parameters():  # master weights: float32, and moved by the steps
        assert param.dtype == torch.float32, name
    moved = [n for n, p in learner.model.named_parameters() if not torch.equal(p.detach(), initial[n])]
    assert len(moved) > len(initial) // 2
    for state in learner.optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    for a, b in zip(exact_learner.params, learner.params, strict=True):  # close to the float32 run, not equal
        torch.testing.assert_close(b, a, rtol=0, atol=5e-3)


def test_the_learner_computes_in_bfloat16_under_autocast(model_dir: Path, files: list[RolloutFile]) -> None:
    loaded = load_model(model_dir)
    learner = learner_on(loaded, resolve_precision("cpu", "bfloat16"))
    seen: list[torch.dtype] = []
    hook = loaded.model.get_output_embeddings().register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    try:
        stats = learner.train_step([files[0]])
    finally:
        hook.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert torch.isfinite(torch.tensor(stats.loss))


def test_checkpoints_of_a_bfloat16_run_are_float32_in_the_initial_layout(
    tmp_path: Path, model_dir: Path, files: list[RolloutFile], task: tuple[TaskSpec, TaskSource]
) -> None:
    loaded = load_model(model_dir)
    learner = learner_on(loaded, resolve_precision("cpu", "bfloat16"))
    loop = TrainingLoop(learner, loaded, *task, RunPaths(tmp_path), rollouts_per_step=16, max_files_per_step=4)
    loop.train([files[0]], idle_seconds=0.0)
    initial = load_file(model_dir / "model.safetensors")
    saved = load_file(loop.paths.checkpoint(1) / "model.safetensors")
    assert sorted(saved) == sorted(initial)
    for name, tensor in saved.items():
        assert (tensor.dtype, tensor.shape, tensor.device.type) == (torch.float32, initial[name].shape, "cpu"), name
    assert any(not torch.equal(saved[n], initial[n]) for n in saved)


def test_a_bfloat16_pool_publishes_its_checkpoints_in_bfloat16_the_master_weights_rounded(
    tmp_path: Path, model_dir: Path, files: list[RolloutFile], task: tuple[TaskSpec, TaskSource]
) -> None:
    spec, source = task
    pool = dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, dtype="bfloat16"))
    loaded = load_model(model_dir)
    learner = learner_on(loaded, resolve_precision("cpu", "float32"))
    loop = TrainingLoop(learner, loaded, pool, source, RunPaths(tmp_path), rollouts_per_step=16, max_files_per_step=4)
    loop.train([files[0]], idle_seconds=0.0)
    saved = load_file(loop.paths.checkpoint(1) / "model.safetensors")
    master = {n: p.detach() for n, p in learner.model.named_parameters()}
    assert sorted(saved) == sorted(load_file(model_dir / "model.safetensors"))  # the tied head once, as before
    for name, tensor in saved.items():  # half the bytes; what every worker and validator computes with
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, master[name].to(torch.bfloat16)), name
    assert master[next(iter(saved))].dtype == torch.float32  # the learner keeps training the float32 weights
    config = json.loads((loop.paths.checkpoint(1) / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    reloaded = load_model(loop.paths.checkpoint(1), dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in reloaded.model.parameters())


def test_the_learner_refuses_bfloat16_master_weights_and_a_model_on_another_device(model_dir: Path) -> None:
    low = load_model(model_dir, dtype=torch.bfloat16)
    with pytest.raises(LearnerError, match=r"master weights must be float32, found torch\.bfloat16"):
        Learner(low.model, LearnerConfig(), pad_id=0)
    cpu = load_model(model_dir)
    elsewhere = Precision(torch.device("cuda"), torch.bfloat16, "told")
    with pytest.raises(LearnerError, match="the model lies on cpu but the trainer was set to train on cuda"):
        Learner(cpu.model, LearnerConfig(), pad_id=0, precision=elsewhere)


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs CUDA")
def test_one_bfloat16_step_on_cuda_trains_float32_weights_on_the_gpu(
    tmp_path: Path, model_dir: Path, files: list[RolloutFile], task: tuple[TaskSpec, TaskSource]
) -> None:
    precision = resolve_precision("auto", "auto")
    assert (precision.device.type, precision.dtype) == ("cuda", torch.bfloat16)
    loaded = load_model(model_dir, device=precision.device)
    learner = learner_on(loaded, precision)
    loop = TrainingLoop(learner, loaded, *task, RunPaths(tmp_path), rollouts_per_step=16, max_files_per_step=4)
    record = loop.train([files[0]], idle_seconds=0.0)
    assert torch.isfinite(torch.tensor([record["loss"], record["grad_norm"]])).all()
    assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in loaded.model.parameters())
    initial = load_file(model_dir / "model.safetensors")
    saved = load_file(loop.paths.checkpoint(1) / "model.safetensors")
    assert sorted(saved) == sorted(initial)
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in saved.values())
    assert any(not torch.equal(saved[n], initial[n]) for n in saved)


# --- trainer.toml and the flags ---------------------------------------------------------------------


def test_run_device_and_dtype_are_read_from_trainer_toml_and_flags_override_them(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(LOCAL)
    assert (load_run_config(path).device, load_run_config(path).dtype) == ("auto", "auto")
    path.write_text(LOCAL.replace("[local]", "device = 'cuda'\ndtype = 'bfloat16'\n[local]"))
    config = load_run_config(path)
    assert (config.device, config.dtype) == ("cuda", "bfloat16")
    config = load_run_config(path, flags={"run.device": "cpu", "run.dtype": "float32"})
    assert (config.device, config.dtype) == ("cpu", "float32")
    assert load_run_config(path, flags={"run.device": None}).device == "cuda"  # a flag not given leaves the file's


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("device = 'gpu'", r"run\.device.*must be one of auto, cpu, cuda, got 'gpu'"),
        ("dtype = 'float16'", r"run\.dtype.*must be one of auto, float32, bfloat16, got 'float16'"),
        ("device = 1", r"run\.device must be one of auto, cpu, cuda, got 1"),
    ],
)
def test_bad_device_or_dtype_in_trainer_toml_is_refused_naming_the_key(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(LOCAL.replace("[local]", f"{line}\n[local]"))
    with pytest.raises(TrainerConfigError, match=message) as caught:
        load_run_config(path)
    assert str(path) in str(caught.value)


def test_a_bad_override_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(LOCAL)
    with pytest.raises(TrainerConfigError, match=r"^--device: must be one of auto, cpu, cuda, got 'tpu'$"):
        load_run_config(path, flags={"run.device": "tpu"})


@pytest.mark.parametrize("command", ["run", "replay", "sft"])
def test_the_commands_take_device_and_dtype(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "--device" in result.output and "--dtype" in result.output
    assert "bfloat16" in result.output and "cuda" in result.output
    bad = CliRunner().invoke(app, [command, "--device", "gpu"])
    assert bad.exit_code == 2 and "gpu" in bad.output  # typer's own refusal of an unknown choice


@pytest.mark.skipif(not NO_CUDA, reason="a machine with CUDA would train")
def test_the_run_flag_reaches_the_config_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "trainer.toml"
    path.write_text(LOCAL.replace("[local]", "device = 'cpu'\n[local]"))
    runner = CliRunner()
    env = {"PRIME_KEYSTORE_PASSWORD": None}
    asked = runner.invoke(app, ["run", "--config", str(path), "--device", "cuda"], env=env)
    assert asked.exit_code == 1
    assert "device cuda asked for, but torch sees no CUDA GPU" in asked.output
    path.write_text(LOCAL.replace("[local]", "device = 'cuda'\n[local]"))
    from_file = runner.invoke(app, ["run", "--config", str(path)], env=env)
    assert from_file.exit_code == 1 and "no CUDA GPU" in from_file.output
    overridden = runner.invoke(app, ["run", "--config", str(path), "--device", "cpu"], env=env)
    assert overridden.exit_code == 1 and "no CUDA GPU" not in overridden.output  # past the device: the keystores
    assert "PRIME_KEYSTORE_PASSWORD" in overridden.output


@pytest.mark.skipif(not NO_CUDA, reason="a machine with CUDA would train")
def test_replay_with_device_cuda_and_no_gpu_fails_in_one_line(tmp_path: Path, model_dir: Path) -> None:
    args = ["replay", "--model", str(model_dir), "--task", str(DEFAULT_TASK), "--rollouts", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run"), "--device", "cuda"])
    assert result.exit_code == 1
    assert "device cuda asked for, but torch sees no CUDA GPU" in result.output
    assert len(result.output.strip().splitlines()) == 1
