"""One GRPO optimizer step per policy step, on one process or several under FSDP2 (DESIGN section 8).

A step takes the verified rollout files chosen for it and:
1. builds samples with group advantages and drops groups whose rewards are all equal (`trainer.data`);
2. puts each group's completions after one copy of their prompt (`trainer.data.prompt_units`: the prompt's
   forward is shared, about 5x fewer tokens on the default task), packs these units first-fit-decreasing into
   micro-batches by token budget, never mixing policy steps in one, and deals the micro-batches out to the ranks;
3. recomputes the old log-probs of each micro-batch under the weights of the policy step that generated it
   (for files of the current policy they are the loss pass's own log-probs, detached).
   The learner keeps the weights of the last `async_level + 1` steps for that: a file from step s - 2 is scored
   against policy s - 2, not against the weights being trained (DESIGN section 8, "ratio against the trainer's
   own log-probs of the generating policy");
4. accumulates the GRPO loss normalised over every completion token of the step (on all ranks together);
5. clips the gradient norm and takes one AdamW step with linear warmup.

Under FSDP2 every rank runs the same number of forward and backward passes (the collectives need it): a rank
with fewer micro-batches than the others runs a copy of one with zero weight.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from transformers import PreTrainedModel

from core.config import ConfigError, Settings, held, setting
from protocol.rollouts import RolloutFile
from protocol.terms import DEFAULT_ASYNC_LEVEL, MAX_ASYNC_LEVEL, step_window
from trainer.data import (
    PromptUnit,
    Sample,
    SharedBatch,
    build_samples,
    collate_units,
    prompt_units,
    shared_logprobs,
)
from trainer.errors import TrainerError
from trainer.grpo import GRPOConfig, group_advantages, grpo_token_loss, require_finite
from trainer.packing import pack_first_fit_decreasing
from trainer.precision import Precision


class LearnerError(TrainerError):
    """The learner was given data it cannot train on, or a state that is not its own."""


@dataclass(frozen=True)
class OptimConfig(Settings):
    """AdamW and the micro-batches: trainer.toml's [optim] table, declared once here."""

    lr: float = setting("AdamW's learning rate, constant after warmup", default=3e-4, minimum=1e-9, maximum=0.5)
    warmup_steps: int = setting("linear warmup from lr / warmup_steps; 0: none", default=3, minimum=0)
    weight_decay: float = setting("AdamW's decoupled weight decay", default=0.0, minimum=0)
    beta1: float = setting("AdamW's first-moment decay", default=0.9, minimum=0, maximum=0.9999)
    beta2: float = setting("AdamW's second-moment decay", default=0.99, minimum=0, maximum=0.9999)
    eps: float = setting(
        "AdamW's epsilon; larger damps the steps of coordinates whose gradients are tiny and noisy",
        default=1e-8,
        minimum=1e-12,
        maximum=0.1,
    )
    grad_clip: float = setting("max global L2 norm of the gradient", default=1.0, minimum=1e-6)
    vector_lr_scale: float = setting(
        "lr multiplier for 1-D parameters (norm gains, biases); 1: one lr for all", default=1.0, minimum=1e-3,
        maximum=1000,
    )  # fmt: skip
    micro_batch_tokens: int = setting(
        "prompt + completion tokens per micro-batch before padding (a group's shared prompt counts once)",
        default=8192,
        minimum=2,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require_finite(self)
        if not self.lr * self.vector_lr_scale < 1:
            where = self.where("vector_lr_scale") or f"{type(self).__name__}.vector_lr_scale"
            raise ConfigError(
                f"{where}: lr * vector_lr_scale must be below 1, got {self.lr} * {self.vector_lr_scale}", where=where
            )


@dataclass(frozen=True)
class LearnerConfig(OptimConfig):
    """What one learner step runs by: the optimiser ([optim]), the loss ([loss]), the window and the sampling
    temperature the log-probs are taken at. Each field is held to its declaration however the config is made."""

    async_level: int = setting(
        "k: files from steps >= s - k are trained on at step s (the pool's term, protocol.terms)",
        default=DEFAULT_ASYNC_LEVEL,
        minimum=0,
        maximum=MAX_ASYNC_LEVEL,
    )
    temperature: float = setting(
        "the sampling temperature: log-probs are taken of logits / temperature (the task's, never trainer.toml's)",
        default=1.0,
        above=0,
    )
    loss: GRPOConfig = held("the GRPO loss (trainer.toml's [loss]), which checks itself", default_factory=GRPOConfig)
    seed: int = setting("the run's seed", default=0, minimum=0)

    def record(self) -> dict[str, Any]:
        """The config as plain values, for a saved training state (what the file and flags set is not kept)."""
        return asdict(self, dict_factory=lambda items: {k: v for k, v in items if k not in ("origins", "file")})

    def lr_at(self, step: int) -> float:
        """Learning rate of the update that turns policy `step` into `step + 1`."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        return self.lr


@dataclass(frozen=True)
class StepStats:
    """What one step did; the training loop adds its own fields (idle time, step duration) before logging."""

    step: int  # the policy step this update produced
    files: int
    rows: int
    samples: int  # rows of the groups that were kept
    groups_kept: int
    groups_dropped: int
    reward_mean: float  # over every row, kept or not
    pass_rate: float  # share of rows whose task reward is 1
    completion_tokens_mean: float
    completion_tokens_max: int
    trained_tokens: int  # completion tokens that carried loss
    micro_batches: int  # on this rank
    loss: float
    grad_norm: float
    clipped_fraction: float
    mean_ratio: float
    kl: float
    entropy: float
    lr: float
    oldest_policy_step: int
    seconds: float
    tokens_per_s: float  # tokens the whole step's forwards computed per second (a shared prompt counts once)

    def as_record(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @staticmethod
    def current() -> World:
        if dist.is_available() and dist.is_initialized():
            return World(dist.get_rank(), dist.get_world_size())
        return World()


def _full(tensor: Tensor) -> Tensor:
    """The whole tensor on CPU, gathering a DTensor's shards (a collective under FSDP2)."""
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().cpu().clone()


def _like(param: Tensor, full: Tensor) -> Tensor:
    """`full` laid out like `param`: sharded the same way when `param` is a DTensor."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(param.device), param.device_mesh, param.placements)  # type: ignore[attr-defined]
    return full.to(param.device)


def _drop_gathered(model: torch.nn.Module) -> None:
    """Frees the whole weights FSDP2 gathered for a forward, so the next forward gathers the shards again.

    FSDP2 keeps the root unit's gathered weights after a forward (training would gather them again at once for
    the backward). A later forward reuses them as they are: without this, weights copied into the shards (a
    past policy for old log-probs, then the current one back) would not reach the embeddings and the LM head.
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


class Learner:
    def __init__(
        self,
        model: PreTrainedModel,
        config: LearnerConfig,
        *,
        pad_id: int,
        step: int = 0,
        precision: Precision | None = None,
    ) -> None:
        """`model` already lies on its device with float32 weights; `precision` (None: float32 where the model
        lies) gives the compute dtype of forward and backward (`trainer.precision`)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.step = step
        self.world = World.current()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = self.params[0].device  # where batches go: the CPU, or this rank's GPU
        if precision is None:
            precision = Precision(self.device, torch.float32, "float32 where the model lies")
        if precision.device.type != self.device.type:
            raise LearnerError(
                f"the model lies on {self.device} but the trainer was set to train on {precision.device}"
            )
        low = sorted({str(p.dtype) for p in self.params if p.dtype != torch.float32})
        if low:  # the master copy: a bfloat16 weight would lose every update under 1/256 of its value
            raise LearnerError(f"master weights must be float32, found {', '.join(low)}: load the model in float32")
        self.precision = precision
        matrices = [p for p in self.params if p.ndim >= 2]
        vectors = [p for p in self.params if p.ndim < 2]
        scales = [(self.params, 1.0)]
        if config.vector_lr_scale != 1.0 and vectors:  # two groups only when asked: states of one group still load
            scales = [(matrices, 1.0), (vectors, config.vector_lr_scale)]
        groups = [{"params": ps, "lr_scale": k, "lr": config.lr_at(step) * k} for ps, k in scales]
        self.optimizer = torch.optim.AdamW(
            groups,
            lr=config.lr_at(step),
            betas=(config.beta1, config.beta2),
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
        self.history: dict[int, list[Tensor]] = {step: self._snapshot()}  # policy step -> its weights
        self.reference = self._snapshot() if config.loss.kl_coef > 0 else None

    # --- weights of past policies -------------------------------------------------------------------

    def _snapshot(self) -> list[Tensor]:
        with torch.no_grad():
            return [p.detach().clone() for p in self.params]

    @contextlib.contextmanager
    def _weights(self, snapshot: list[Tensor]) -> Iterator[None]:
        """Runs the block with `snapshot` loaded into the model, then puts the current weights back."""
        current = self._snapshot()
        with torch.no_grad():
            for p, s in zip(self.params, snapshot, strict=True):
                p.copy_(s)
        _drop_gathered(self.model)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, c in zip(self.params, current, strict=True):
                    p.copy_(c)
            _drop_gathered(self.model)

    # --- forward ------------------------------------------------------------------------------------

    def _forward(self, batch: SharedBatch, *, entropy: bool) -> tuple[Tensor, Tensor | None]:
        """(N, W) float32 log-probs (and entropy): the model computes in the compute dtype, the log_softmax over
        float32 logits (`shared_logprobs`), so ratios against past policies' log-probs stay exact."""
        with self.precision.autocast():
            return shared_logprobs(self.model, batch, temperature=self.config.temperature, entropy=entropy)

    def _logprobs_under(self, snapshot: list[Tensor], batches: Sequence[SharedBatch]) -> list[Tensor]:
        with self._weights(snapshot), torch.no_grad():
            return [self._forward(b, entropy=False)[0] for b in batches]

    # --- the step -----------------------------------------------------------------------------------

    def _plan(self, samples: list[Sample]) -> list[tuple[int, list[PromptUnit], float]]:
        """This rank's micro-batches as (policy step, prompt units, weight 1 or 0), the same count on every rank."""
        by_step: dict[int, list[Sample]] = {}
        for sample in samples:
            by_step.setdefault(sample.step, []).append(sample)
        mine: list[tuple[int, list[PromptUnit], float]] = []
        for policy_step in sorted(by_step):
            group = prompt_units(by_step[policy_step], self.config.micro_batch_tokens)
            bins = pack_first_fit_decreasing([u.n_tokens for u in group], self.config.micro_batch_tokens)
            rounds = math.ceil(len(bins) / self.world.size)
            for r in range(rounds):
                index = r * self.world.size + self.world.rank
                if index < len(bins):
                    mine.append((policy_step, [group[i] for i in bins[index]], 1.0))
                else:  # keeps the collectives in step: a copy of a real micro-batch that adds nothing
                    mine.append((policy_step, [group[i] for i in bins[0]], 0.0))
        return mine

    def _sum(self, values: list[float]) -> list[float]:
        if self.world.size == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def train_step(self, files: Sequence[RolloutFile]) -> StepStats:
        """One update from policy `self.step` to `self.step + 1` on `files` (the same list on every rank)."""
        started = time.perf_counter()
        rows = [row for f in files for row in f.rows]
        if not rows:
            raise LearnerError("a step needs at least one rollout row")
        window = step_window(self.step, self.config.async_level)
        steps = {row.step for row in rows}
        if not all(step in window for step in steps):
            raise LearnerError(
                f"policy {self.step} with async level {self.config.async_level} trains on steps "
                f"{window}, got files from steps {sorted(steps)}"
            )
        missing = [s for s in steps if s not in self.history]
        if missing:
            raise LearnerError(f"no weights of policy steps {missing} are kept; cannot compute their old log-probs")
        sample_set = build_samples(files, lambda r: group_advantages(torch.tensor(r, dtype=torch.float32)).tolist())
        plan = self._plan(sample_set.samples)
        batches = [collate_units(units, self.pad_id).to(self.device) for _, units, _ in plan]
        weights = [w for _, _, w in plan]
        lr = self.config.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

        old: list[Tensor | None] = [None] * len(batches)
        for policy_step in sorted({s for s, _, _ in plan} - {self.step}):  # current policy: the loss pass's own
            indices = [i for i, (s, _, _) in enumerate(plan) if s == policy_step]
            scored = self._logprobs_under(self.history[policy_step], [batches[i] for i in indices])
            for i, logprobs in zip(indices, scored, strict=True):
                old[i] = logprobs
        ref = self._logprobs_under(self.reference, batches) if self.reference is not None else None

        local_tokens = sum(int(b.loss_mask.sum()) * w for b, w in zip(batches, weights, strict=True))
        total_tokens = int(self._sum([float(local_tokens)])[0])
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "clipped": 0.0, "ratio": 0.0, "kl": 0.0, "entropy": 0.0}
        for i, (batch, weight) in enumerate(zip(batches, weights, strict=True)):
            logp, ent = self._forward(batch, entropy=self.config.loss.entropy_coef > 0)
            # files of the current policy: the weights do not change before optimizer.step, so its log-probs are
            # this very forward's, detached (one forward pass saved per micro-batch)
            recorded = old[i]
            old_logp = recorded if recorded is not None else logp.detach()
            out = grpo_token_loss(
                logp,
                old_logp,
                batch.advantages,
                batch.loss_mask,
                self.config.loss,
                logp_ref=None if ref is None else ref[i],
                entropy=ent,
            )
            share = weight * out.tokens / max(total_tokens, 1)  # token-level normalisation over the whole step
            (out.loss * share * self.world.size).backward()  # FSDP2 averages gradients over ranks: undo it
            counted = weight * out.tokens
            sums["loss"] += float(out.loss.detach()) * counted
            sums["clipped"] += out.clipped_fraction * counted
            sums["ratio"] += out.mean_ratio * counted
            sums["kl"] += out.kl * counted
            sums["entropy"] += out.entropy * counted
        self.model.eval()
        grad_norm = float("nan")
        if total_tokens:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)
            grad_norm = float(_full(norm)) if hasattr(norm, "full_tensor") else float(norm)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.history[self.step] = self._snapshot()
        for old_step in [s for s in self.history if s < step_window(self.step, self.config.async_level).oldest]:
            del self.history[old_step]

        totals = self._sum([sums[k] for k in sums])
        per_token = dict(zip(sums, (t / total_tokens if total_tokens else float("nan") for t in totals), strict=True))
        local_processed = sum(b.tokens * w for b, w in zip(batches, weights, strict=True))
        processed = self._sum([float(local_processed)])[0]
        seconds = time.perf_counter() - started
        lengths = [len(row.output_tokens) for row in rows]
        return StepStats(
            step=self.step,
            files=len(files),
            rows=len(rows),
            samples=len(sample_set.samples),
            groups_kept=sample_set.groups_kept,
            groups_dropped=sample_set.groups_dropped,
            reward_mean=sum(row.reward for row in rows) / len(rows),
            pass_rate=sum(row.task_reward >= 1.0 for row in rows) / len(rows),
            completion_tokens_mean=sum(lengths) / len(lengths),
            completion_tokens_max=max(lengths),
            trained_tokens=total_tokens,
            micro_batches=len(batches),
            loss=per_token["loss"],
            grad_norm=grad_norm,
            clipped_fraction=per_token["clipped"],
            mean_ratio=per_token["ratio"],
            kl=per_token["kl"],
            entropy=per_token["entropy"],
            lr=lr,
            oldest_policy_step=min(steps),
            seconds=seconds,
            tokens_per_s=processed / seconds if seconds > 0 else 0.0,
        )

    # --- full training state ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights, optimiser, step, kept past policies, RNG.

        Tensors are whole and on CPU (gathered from every rank under FSDP2: call it on all ranks). The current
        policy is stored once, as the model: its copy among the kept policies is rebuilt from it on load.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer, options=options)
        return {
            "format": 1,
            "step": self.step,
            "config": self.config.record(),
            "model": model_state,
            "optimizer": optimizer_state,
            "history": {s: [_full(t) for t in snapshot] for s, snapshot in self.history.items() if s != self.step},
            "reference": None if self.reference is None else [_full(t) for t in self.reference],
            "rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        if state.get("format") != 1:
            raise LearnerError(f"not a learner state of format 1 (format {state.get('format')!r})")
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=StateDictOptions(full_state_dict=True),
        )
        self.step = int(state["step"])
        self.history = {
            int(s): [_like(p, t) for p, t in zip(self.params, snap, strict=True)]
            for s, snap in state["history"].items()
        }
        self.history[self.step] = self._snapshot()  # states saved before it was left out carry the same values
        if state["reference"] is not None:
            self.reference = [_like(p, t) for p, t in zip(self.params, state["reference"], strict=True)]
        torch.set_rng_state(state["rng"])
