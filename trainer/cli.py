"""`prime-train`: the trainer's commands. Thin: validate flags, call a library function, print.

torch and transformers load inside each command body, after the arguments are parsed, so `prime-train --help`
stays instant.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from core.trace import configure_tracing
from ledger.cli.common import (
    CommandError,
    JsonOption,
    cli_errors,
    configure_daemon_logging,
    configure_logging,
    print_json,
    stderr_console,
    stdout_console,
)
from trainer.precision import Device, Dtype

if TYPE_CHECKING:
    from trainer.config import RunConfig
    from trainer.ranks import Control

DeviceOption = Annotated[
    Device, typer.Option("--device", help="Where to train: auto is CUDA when torch sees a GPU, else the CPU.")
]
DtypeOption = Annotated[
    Dtype,
    typer.Option(
        "--dtype", help="Compute dtype (autocast); weights and checkpoints stay float32. auto: bfloat16 on CUDA."
    ),
]

app = typer.Typer(
    name="prime-train",
    no_args_is_help=True,
    help="Train a pool's policy with GRPO on verified rollouts, and make the embedded default model.",
)


@app.callback()
def main() -> None:
    """Train a pool's policy with GRPO on verified rollouts, and make the embedded default model."""


@app.command("init-model")
def init_model_command(
    out: Annotated[
        Path,
        typer.Option("--out", metavar="DIR", help="Directory to create (Hugging Face layout).", show_default=False),
    ],
    seed: Annotated[int, typer.Option("--seed", min=0, metavar="N", help="Seed of the random initialisation.")] = 0,
    shape: Annotated[
        str,
        typer.Option(
            "--shape",
            metavar="NAME",
            help="tiny (1.2M parameters, byte tokenizer) or qwen2.5-0.5b (Qwen2.5-0.5B's configuration, a BPE "
            "tokenizer trained on the tasks, bfloat16, sharded).",
        ),
    ] = "tiny",
    layers: Annotated[
        int | None, typer.Option("--layers", min=1, metavar="N", help="A shallower variant of the shape (tests).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", metavar="T", help="float32 or bfloat16 (default: the shape's).")
    ] = None,
    task: Annotated[
        list[Path] | None,
        typer.Option("--task", metavar="SPEC", help="A task whose problems the BPE tokenizer learns from (repeat)."),
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace DIR if it holds something.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Create a model from a seed: the embedded tiny Qwen2 (a byte tokenizer), or a real shape (--shape)."""
    configure_logging()
    with cli_errors():
        from dataclasses import replace

        from engine.model.loading import model_hash_of, parameter_count
        from engine.model.shapes import DTYPES, SHAPES
        from engine.model.tiny import init_model
        from protocol.tasks.spec import load_task_spec

        if shape not in SHAPES:
            raise CommandError(f"--shape {shape!r}: choose one of {', '.join(SHAPES)}")
        if dtype is not None and dtype not in DTYPES:
            raise CommandError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        chosen = SHAPES[shape]
        try:
            chosen = chosen.with_layers(layers) if layers is not None else chosen
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        chosen = replace(chosen, dtype=dtype) if dtype is not None else chosen
        specs = [load_task_spec(path) for path in task or ()]
        started = time.perf_counter()
        path = init_model(out, seed=seed, shape=chosen, specs=specs, overwrite=overwrite).resolve()
        seconds = time.perf_counter() - started
        parameters = parameter_count(path)
        model_hash = "0x" + model_hash_of(path).hex()
        if json_output:
            print_json(
                {
                    "path": str(path),
                    "parameters": parameters,
                    "model_hash": model_hash,
                    "seed": seed,
                    "shape": chosen.name,
                    "dtype": chosen.dtype,
                }
            )
            return
        console = stdout_console()
        console.print(f"created the {chosen.name} model (seed {seed}, {chosen.dtype}) in {seconds:.1f} s")
        console.print(f"parameters: {parameters:,}")
        console.print(f"model hash: {model_hash}")
        console.print(f"path:       {path}")


@app.command("sft")
def sft_command(
    model: Annotated[Path, typer.Option("--model", metavar="DIR", help="Model to start from (Hugging Face layout).")],
    task: Annotated[Path, typer.Option("--task", metavar="SPEC", help="Task spec (TOML) with worked answers.")],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory for the trained model.")],
    steps: Annotated[int, typer.Option("--steps", min=1, metavar="N", help="Optimizer steps.")] = 600,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Examples per step.")] = 64,
    lr: Annotated[float, typer.Option("--lr", min=1e-7, max=1.0, help="Peak learning rate.")] = 1.5e-3,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the example order.")] = 0,
    eval_problems: Annotated[int, typer.Option("--eval", min=0, help="Held-out problems to measure.")] = 256,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace DIR if it holds something.")] = False,
    device: DeviceOption = Device.AUTO,
    dtype: DtypeOption = Dtype.AUTO,
    json_output: JsonOption = False,
) -> None:
    """Warm-start MODEL on the task's worked answers, then report the pass rate before and after."""
    configure_logging()
    with cli_errors():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from engine.model.loading import load_model
        from engine.model.tiny import save_model_dir
        from protocol.tasks.sources import open_source
        from protocol.tasks.spec import load_task_spec
        from trainer.evaluate import PassRate, sample_rewards
        from trainer.precision import resolve_precision
        from trainer.sft import SFTConfig, SFTStep, held_out_ids, run_sft

        config = SFTConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, holdout=max(eval_problems, 1))
        precision = resolve_precision(device.value, dtype.value)
        if not json_output:
            stderr_console().print(precision.describe())
        spec = load_task_spec(task)
        source = open_source(spec)
        loaded = load_model(model, device=precision.device)
        held_out = held_out_ids(source, config)[:eval_problems]
        before = PassRate.of(sample_rewards(loaded, spec, source, held_out, samples=1)) if eval_problems else None
        last_loss = float("nan")
        columns = (
            TextColumn("sft"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, transient=True, disable=json_output) as bar:
            progress = bar.add_task("sft", total=steps, loss="")

            def on_step(step: SFTStep) -> None:
                nonlocal last_loss
                last_loss = step.loss
                bar.update(progress, advance=1, loss=f"loss {last_loss:.3f}")

            started = time.perf_counter()
            run_sft(loaded, spec, source, config, on_step=on_step, precision=precision)
            seconds = time.perf_counter() - started
        after = PassRate.of(sample_rewards(loaded, spec, source, held_out, samples=1)) if eval_problems else None
        save_model_dir(loaded.model, loaded.tokenizer, out, overwrite=overwrite)
        summary = {
            "path": str(out.resolve()),
            "steps": steps,
            "final_loss": round(last_loss, 4),
            "seconds": round(seconds, 1),
            "pass_rate_before": before.rate if before else None,
            "pass_rate_after": after.rate if after else None,
            "eval_problems": len(held_out),
        }
        if json_output:
            print_json(summary)
            return
        console = stdout_console()
        console.print(f"trained {steps} steps in {seconds:.0f} s, final loss {last_loss:.3f}; wrote {out}")
        if before and after:
            console.print(
                f"pass rate on {len(held_out)} held-out problems: {before.rate:.1%} before, {after.rate:.1%} after"
            )


@app.command("run")
def run_command(
    config: Annotated[Path, typer.Option("--config", metavar="FILE", help="trainer.toml (see configs/trainer.toml).")],
    local_workers: Annotated[
        int | None,
        typer.Option("--local-workers", min=1, max=256, metavar="N", help="Local mode: start N trusted workers."),
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=1, metavar="S", help="Train until policy step S.")] = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", metavar="DIR", help="Replaces [run] dir.")] = None,
    max_minutes: Annotated[
        float | None,
        typer.Option("--max-minutes", min=0.01, metavar="M", help="Stop after the step that ends past M minutes."),
    ] = None,
    dev_key: Annotated[
        int | None,
        typer.Option("--dev-key", min=0, max=9, metavar="I", help="Network mode on a local devnet: anvil account I."),
    ] = None,
    device: Annotated[
        Device | None, typer.Option("--device", help="Where to train; replaces [run] device (default auto).")
    ] = None,
    dtype: Annotated[
        Dtype | None, typer.Option("--dtype", help="Compute dtype; replaces [run] dtype (default auto).")
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Serve the coordinator API and the SHARDCAST origin, and train with GRPO until the last step.

    It resumes from the newest full state in the run folder. Each step appends a line to metrics.jsonl. Under
    torchrun every rank trains, sharded with FSDP2; rank 0 alone serves, runs the workers and writes the run folder.
    """
    with cli_errors():
        configure_daemon_logging()
        configure_tracing("trainer")
        from trainer.config import load_run_config

        flags: dict[str, Any] = {  # trainer.toml's keys they replace (trainer.config.TrainerSettings)
            "local.workers": local_workers,
            "run.steps": steps,
            "run.dir": run_dir,
            "run.max_minutes": max_minutes,
            "run.device": device,
            "run.dtype": dtype,
        }
        loaded = load_run_config(config, flags=flags)
        from trainer.precision import cuda_wanted

        cuda_wanted(loaded.device)  # `cuda` without a GPU: one line now, before any keystore is asked for
        from trainer.distributed import init_distributed, shutdown
        from trainer.ranks import Control

        world = init_distributed(device=loaded.device)  # one process: no group, and nothing below changes
        try:
            control = Control(world) if world.size > 1 else None
            if control is not None and world.rank != 0:
                from trainer.run import follow_training

                follow_training(control.share_config(None), control)  # serves nothing, prints nothing
                return
            _run_rank0(config, loaded, flags, dev_key, control, json_output)
        finally:
            shutdown()


def _run_rank0(
    config: Path,
    loaded: RunConfig,
    flags: dict[str, Any],
    dev_key: int | None,
    control: Control | None,
    json_output: bool,
) -> None:
    """The trainer the pool sees: its keys, its pool, the coordinator and the origin; the only process on one."""
    import asyncio

    from trainer.config import load_run_config
    from trainer.run import LocalWorkerKeys, local_network, network_from_pool, run_training

    keys: LocalWorkerKeys | None = None
    if loaded.local:
        network, keys = local_network(loaded.run_dir, loaded.local_workers, _local_password(loaded))
    else:  # the pool's terms fill what trainer.toml leaves out, and refuse what contradicts them
        network = network_from_pool(loaded, dev_key)
        loaded = load_run_config(config, terms=network.terms, flags=flags)
    if control is not None:  # the pool's terms are read here alone: every rank trains with these settings
        loaded = control.share_config(loaded)
    console = stderr_console()

    def on_ready(api_url: str, origin_url: str) -> None:
        mode = f"local mode, {len(keys.paths)} workers" if keys is not None else f"pool {network.pool_id}"
        console.print(f"coordinator {api_url}, origin {origin_url}, trainer {network.account.address} ({mode})")

    def on_step(record: dict[str, object]) -> None:
        if json_output:
            return
        evaluated = record.get("eval_pass_rate")
        console.print(
            f"step {record['step']:>4}  reward {record['reward_mean']:.3f}  pass {record['pass_rate']:6.1%}"
            f"  loss {record['loss'] if record['loss'] is None else format(record['loss'], '+.4f')}"
            f"  files {record['files']:>3}  idle {record['idle_seconds']:5.1f} s"
            f"  train {record['train_seconds']:5.1f} s"
            + (f"  eval {evaluated:6.1%}" if isinstance(evaluated, float) else "")
        )

    summary = asyncio.run(
        run_training(loaded, network, worker_keys=keys, on_step=on_step, on_ready=on_ready, control=control)
    )
    result = {
        "run_dir": str(summary.run_dir),
        "start_step": summary.start_step,
        "final_step": summary.final_step,
        "seconds": round(summary.seconds, 1),
        "idle_seconds": round(summary.idle_seconds, 1),
        "stale_files": summary.stale_files,
        "metrics": str(summary.run_dir / "metrics.jsonl"),
    }
    if json_output:
        print_json(result)
        return
    share = summary.idle_seconds / summary.seconds if summary.seconds else 0.0
    stdout_console().print(
        f"trained steps {summary.start_step} -> {summary.final_step} in {summary.seconds:.0f} s "
        f"(idle {summary.idle_seconds:.0f} s = {share:.0%} waiting for data, {summary.stale_files} stale files); "
        f"metrics in {result['metrics']}"
    )


def _local_password(config: RunConfig) -> str:
    """The password of local mode's keystores: PRIME_KEYSTORE_PASSWORD, else a prompt (asked twice when a keystore is
    about to be made) when stdin is a terminal; without either, one line that names the variable."""
    from ledger.accounts import PASSWORD_ENV_VAR, PasswordError, resolve_password
    from trainer.run import missing_local_keystores

    keys = config.run_dir / "keys"
    creating = bool(missing_local_keystores(config.run_dir, config.local_workers))
    try:
        return resolve_password(prompt=sys.stdin.isatty(), confirm=creating)
    except PasswordError as exc:
        if PASSWORD_ENV_VAR not in os.environ and not sys.stdin.isatty():
            raise PasswordError(
                f"local mode keeps its keys in encrypted keystores ({keys}) and has no password for them:"
                f" set {PASSWORD_ENV_VAR}, or start it from a terminal to be asked"
            ) from None
        raise PasswordError(f"the keystores of local mode ({keys}): {exc}") from None


@app.command("replay")
def replay_command(
    model: Annotated[Path, typer.Option("--model", metavar="DIR", help="Initial policy (Hugging Face layout).")],
    task: Annotated[Path, typer.Option("--task", metavar="SPEC", help="Task spec (TOML) the rollouts answer.")],
    rollouts: Annotated[
        Path, typer.Option("--rollouts", metavar="DIR", help="Folder of rollout files (*.parquet), e.g. an inbox.")
    ],
    out: Annotated[Path, typer.Option("--out", metavar="RUN_DIR", help="Run folder: state, checkpoints, metrics.")],
    steps: Annotated[
        int | None,
        typer.Option("--steps", min=1, metavar="S", help="Train until policy step S (default: until data runs out)."),
    ] = None,
    async_level: Annotated[
        int, typer.Option("--async-level", min=0, metavar="K", help="At step s, train on files of steps s-K .. s.")
    ] = 1,
    rollouts_per_step: Annotated[
        int, typer.Option("--rollouts-per-step", min=1, metavar="N", help="Completions each step trains on.")
    ] = 256,
    lr: Annotated[float, typer.Option("--lr", min=1e-9, max=0.999, help="Peak learning rate (AdamW).")] = 3e-4,
    micro_batch_tokens: Annotated[
        int, typer.Option("--micro-batch-tokens", min=2, metavar="N", help="Prompt + completion tokens a micro-batch.")
    ] = 8192,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of torch's RNG.")] = 0,
    device: DeviceOption = Device.AUTO,
    dtype: DtypeOption = Dtype.AUTO,
    json_output: JsonOption = False,
) -> None:
    """Train with GRPO offline on recorded rollout files; under torchrun, sharded over the ranks with FSDP2.

    Each step chooses unused files of its async window as `run` does (freshest policy first, until it has N
    completions); the replay stops when the folder holds too few. It resumes from the newest state in RUN_DIR;
    under torchrun every rank trains and rank 0 alone writes there.
    """
    configure_logging()
    with cli_errors():
        from trainer.distributed import init_distributed, shutdown
        from trainer.learner import LearnerConfig
        from trainer.replay import ReplayConfig, replay

        learner = LearnerConfig(lr=lr, micro_batch_tokens=micro_batch_tokens, async_level=async_level, seed=seed)
        config = ReplayConfig(
            model, task, rollouts, out, steps, rollouts_per_step, learner, seed, device=device.value, dtype=dtype.value
        )
        console = stderr_console()

        def on_step(record: dict[str, object]) -> None:
            if not json_output:
                loss = record["loss"]
                console.print(
                    f"step {record['step']:>4}  reward {record['reward_mean']:.3f}  pass {record['pass_rate']:6.1%}"
                    f"  loss {loss if loss is None else format(loss, '+.4f')}  files {record['files']:>3}"
                    f"  micro-batches {record['micro_batches']:>3}  train {record['train_seconds']:5.1f} s"
                )

        world = init_distributed(device=config.device)  # cpu: gloo, and no rank takes a GPU
        try:
            if world.rank == 0 and not json_output:  # after init_distributed: under torchrun cuda is the rank's GPU
                from trainer.precision import resolve_precision

                console.print(resolve_precision(config.device, config.dtype).describe())
            summary = replay(config, world, on_step=on_step)
        finally:
            shutdown()
        if world.rank != 0:
            return
        result = {
            "run_dir": str(summary.run_dir.resolve()),
            "start_step": summary.start_step,
            "final_step": summary.final_step,
            "world_size": summary.world_size,
            "seconds": round(summary.seconds, 1),
            "stopped": summary.stopped,
            "metrics": str((summary.run_dir / "metrics.jsonl").resolve()),
        }
        if json_output:
            print_json(result)
            return
        if summary.stopped:
            console.print(f"stopped: {summary.stopped}")
        processes = f"{summary.world_size} process" + ("es" if summary.world_size > 1 else "")
        stdout_console().print(
            f"trained steps {summary.start_step} -> {summary.final_step} on {processes} in {summary.seconds:.0f} s; "
            f"metrics in {result['metrics']}"
        )


@app.command("plot")
def plot_command(
    metrics: Annotated[
        Path,
        typer.Option("--metrics", metavar="FILE", help="A run's metrics JSONL, one line a step.", show_default=False),
    ],
    out: Annotated[Path, typer.Option("--out", metavar="PNG", help="Image to write (atomically).", show_default=False)],
    title: Annotated[str | None, typer.Option("--title", metavar="TEXT", help="Title above the figure.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Draw a run's reward curve to PNG: reward and pass rate per step and smoothed, held-out evaluations as points."""
    configure_logging()
    with cli_errors():
        import warnings

        from ledger.cli.common import warn
        from trainer.plot import NoMetricsError, PartialLastLineWarning, plot_metrics, read_metrics

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PartialLastLineWarning)
            records = read_metrics(metrics)
        for warning in caught:
            warn(f"warning: {warning.message}")
        if not records:
            raise NoMetricsError(f"{metrics} holds no metrics records yet: has training finished a step?")
        summary = plot_metrics(records, out, title=title)
        path = summary.path.resolve()
        if json_output:
            print_json(
                {
                    "path": str(path),
                    "steps": summary.steps,
                    "eval_points": summary.eval_points,
                    "first_step": summary.first_step,
                    "last_step": summary.last_step,
                    "first_pass_rate": summary.first_pass_rate,
                    "last_pass_rate": summary.last_pass_rate,
                }
            )
            return
        console = stdout_console()
        console.print(
            f"plotted {summary.steps} steps ({summary.first_step} to {summary.last_step}), "
            f"{summary.eval_points} held-out evaluations"
        )
        console.print(
            f"pass rate: {summary.first_pass_rate:.1%} at step {summary.first_step}, "
            f"{summary.last_pass_rate:.1%} at step {summary.last_step}"
        )
        console.print(f"path:      {path}")


@app.command("eval")
def eval_command(
    model: Annotated[Path, typer.Option("--model", metavar="DIR", help="Model to measure (Hugging Face layout).")],
    task: Annotated[Path, typer.Option("--task", metavar="SPEC", help="Task spec (TOML).")],
    problems: Annotated[
        int, typer.Option("--problems", min=1, metavar="N", help="The task's last N problems (held out by SFT).")
    ] = 256,
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="K", help="Completions per problem.")] = 4,
    seed: Annotated[int, typer.Option("--seed", min=0, metavar="S", help="Sampling seed.")] = 123,
    threads: Annotated[int, typer.Option("--threads", min=0, metavar="T", help="torch threads; 0: default.")] = 0,
    json_output: JsonOption = False,
) -> None:
    """Held-out pass rate of MODEL: K samples of each of the task's last N problems at the task's sampling."""
    configure_logging()
    with cli_errors():
        from trainer.evaluate import held_out_pass_rate

        if threads:
            import torch

            torch.set_num_threads(threads)
        started = time.perf_counter()
        result = held_out_pass_rate(model, task, problems=problems, samples=samples, seed=seed)
        seconds = time.perf_counter() - started
        if json_output:
            print_json(
                {
                    "model": str(model.resolve()),
                    "pass_rate": result.rate,
                    "passed": result.passed,
                    "total": result.total,
                    "mean_reward": result.mean_reward,
                    "problems": problems,
                    "samples": samples,
                    "seed": seed,
                    "seconds": round(seconds, 1),
                }
            )
            return
        stdout_console().print(
            f"pass rate {result.rate:.1%} ({result.passed} of {result.total}: {problems} held-out problems x {samples}"
            f" samples, seed {seed}) in {seconds:.0f} s"
        )


@app.command("filter")
def filter_command(
    model: Annotated[Path, typer.Option("--model", metavar="DIR", help="Base model whose pass rates decide.")],
    task: Annotated[Path, typer.Option("--task", metavar="SPEC", help="Task spec (TOML) to filter.")],
    out: Annotated[Path, typer.Option("--out", metavar="NEW_SPEC", help="The filtered spec to write (TOML).")],
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="G", help="Completions per problem.")] = 8,
    low: Annotated[float, typer.Option("--min", min=0.0, max=1.0, help="Lowest pass rate kept (inclusive).")] = 0.1,
    high: Annotated[float, typer.Option("--max", min=0.0, max=1.0, help="Highest pass rate kept (inclusive).")] = 0.9,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, metavar="N", help="Measure only the first N problems.")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the sampled completions.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace NEW_SPEC and its list.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Keep the problems whose pass rate under MODEL lies in [--min, --max]; write them as a new task spec."""
    configure_logging()
    with cli_errors():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from engine.model.loading import load_model
        from protocol.tasks.sources import open_source
        from protocol.tasks.spec import load_task_spec, spec_hash
        from trainer.offline_filter import (
            PassBand,
            check_outputs,
            measure_pass_rates,
            problem_list_path,
            rate_histogram,
            select_in_band,
            write_filtered_spec,
        )

        band = PassBand(low, high)
        check_outputs(task, out, overwrite=overwrite)
        spec = load_task_spec(task)
        source = open_source(spec)
        problem_ids = source.problem_ids()[:limit] if limit is not None else source.problem_ids()
        everything = band.low == 0.0 and band.high == 1.0  # every rate lies in it: nothing to measure
        loaded = None if everything else load_model(model)
        columns = (TextColumn("pass rates"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, transient=True, disable=json_output or everything) as bar:
            progress = bar.add_task("sample", total=len(problem_ids) * samples)
            started = time.perf_counter()
            rates = (
                {pid: 1.0 for pid in problem_ids}
                if loaded is None
                else measure_pass_rates(
                    loaded,
                    spec,
                    source,
                    problem_ids,
                    samples=samples,
                    seed=seed,
                    progress=lambda n: bar.update(progress, advance=n),
                )
            )
            seconds = time.perf_counter() - started
        kept = select_in_band(rates, band)
        new_spec = write_filtered_spec(task, kept, out, overwrite=overwrite)
        histogram = [] if everything else rate_histogram(rates)
        summary = {
            "spec": str(new_spec.path),
            "problems": str(problem_list_path(out).resolve()),
            "measured": 0 if everything else len(rates),
            "kept": len(kept),
            "samples": 0 if everything else samples,
            "band": [band.low, band.high],
            "histogram": {f"{rate:g}": count for rate, count in histogram},
            "spec_hash": "0x" + spec_hash(new_spec).hex(),
            "seconds": round(seconds, 1),
        }
        if json_output:
            print_json(summary)
            return
        console = stdout_console()
        if everything:
            console.print(f"kept all {len(kept)} problems: the band [0, 1] holds every pass rate, none was measured")
        else:
            console.print(f"measured {len(rates)} problems x {samples} samples in {seconds:.1f} s")
        width = max((count for _, count in histogram), default=1)
        for rate, count in histogram:
            mark = "kept" if rate in band else ""
            console.print(f"  pass rate {rate:5.3f}  {count:6d}  {'#' * max(1, round(40 * count / width)):40s}  {mark}")
        console.print(f"kept {len(kept)} of {len(rates)} with pass rate in [{band.low:g}, {band.high:g}]")
        console.print(f"spec:      {summary['spec']}")
        console.print(f"problems:  {summary['problems']}")
        console.print(f"spec hash: {summary['spec_hash']}")


if __name__ == "__main__":
    app()
