"""The GRPO objective of INTELLECT-2 (DESIGN section 8) as pure functions over CPU tensors.

Per group of G completions of one problem, rewards become advantages; per generated token, the policy's
new log-prob against the generating policy's gives a ratio, and the loss is the two-sided clipped surrogate

    ratio   = exp(logp_new - logp_old)
    loss_t  = -min(min(ratio, delta) * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
            + kl_coef * k3(logp_ref, logp_new) - entropy_coef * entropy_t
    loss    = sum(loss_t over counted tokens) / number of counted tokens

`delta` bounds the ratio when A < 0: plain PPO clipping leaves `ratio * A` unbounded below for a negative
advantage, so one token whose probability exploded could dominate the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from core.config import ConfigError, Settings, declared, setting
from trainer.errors import TrainerError

ADVANTAGE_EPS = 1e-6  # added to the group's std so an almost-uniform group gives small, finite advantages


class GRPOError(TrainerError, ValueError):
    """A GRPO config or input the loss cannot use; the message names the offending value or shape."""


@dataclass(frozen=True)
class GRPOConfig(Settings):
    """Clipping and regularisation of the GRPO loss (defaults: INTELLECT-2): trainer.toml's [loss] table, declared
    once here. Each field is held to its declaration however the config is made (GRPOError names it)."""

    eps_low: float = setting("the ratio is clipped below at 1 - eps_low", default=0.2, minimum=0, below=1)
    eps_high: float = setting("the ratio is clipped above at 1 + eps_high", default=0.2, minimum=0)
    delta: float = setting(
        "cap on the ratio in the unclipped term (bounds the loss of negative advantages)", default=4.0, above=1
    )
    entropy_coef: float = setting(
        "weight of the entropy bonus subtracted from the loss; 0: off", default=0.0, minimum=0
    )
    kl_coef: float = setting(
        "weight of the k3 KL to the initial policy added to the loss; 0: off (keeps one more copy of the weights)",
        default=0.0,
        minimum=0,
    )

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
            require_finite(self)
        except ConfigError as exc:
            raise GRPOError(str(exc)) from None


def require_finite(settings: Settings) -> None:
    """Raises a ConfigError naming the first float field of `settings` that is infinite (a bound of its own says
    what range a value must lie in; an unbounded one must still be a number)."""
    for item in declared(type(settings)):
        value = getattr(settings, item.name)
        if item.kind is float and isinstance(value, float) and not math.isfinite(value):
            where = settings.where(item.name) or f"{type(settings).__name__}.{item.name}"
            raise ConfigError(f"{where} must be a finite number, got {value!r}", where=where)


@dataclass(frozen=True)
class LossOutput:
    """The loss to backpropagate and what to log about it; statistics are over counted tokens only."""

    loss: Tensor  # scalar, carries the graph of logp_new (and entropy, if given)
    clipped_fraction: float  # share of tokens whose chosen term is not ratio * A (clip or delta cap active)
    mean_ratio: float
    kl: float  # mean k3 KL to the reference; 0.0 when logp_ref is not given
    entropy: float  # mean entropy; 0.0 when entropy is not given
    tokens: int


def _check_rewards(rewards: Tensor) -> Tensor:
    if rewards.dim() != 1 or rewards.numel() == 0:
        raise GRPOError(f"rewards must be a non-empty 1-D tensor (G,), got shape {tuple(rewards.shape)}")
    if not torch.isfinite(rewards).all():
        raise GRPOError(f"rewards must be finite, got {rewards.tolist()}")
    return rewards.to(torch.float32)


def group_advantages(rewards: Tensor) -> Tensor:
    """(G,) rewards of one group -> (G,) advantages `(r - mean) / (std + 1e-6)`.

    std is the population std (`unbiased=False`, divide by G), as in INTELLECT-2 / prime-rl: the group is the
    whole population whose rewards are being centred, not a sample of a larger one, and a group of one gets
    advantage 0 instead of the NaN a sample std (divide by G - 1) would give.
    """
    r = _check_rewards(rewards)
    return (r - r.mean()) / (r.std(unbiased=False) + ADVANTAGE_EPS)


def keep_group(rewards: Tensor) -> bool:
    """True unless every reward of the group is the same float (such a group has zero advantages, no signal).

    Equality is exact, with no tolerance: rewards are mostly discrete (0/1 plus a length penalty), and a group
    whose rewards differ only slightly already gets small advantages from the `+ 1e-6` in the denominator, so
    a tolerance would only add a threshold to tune.
    """
    r = _check_rewards(rewards)
    return bool((r != r[0]).any())


def _check_tokens(name: str, x: Tensor, shape: torch.Size, counted: Tensor) -> Tensor:
    """Check a (B, T) per-token tensor and zero its uncounted positions, so padding cannot leak NaN/inf."""
    if x.shape != shape:
        raise GRPOError(f"{name} must have shape {tuple(shape)} like logp_new, got {tuple(x.shape)}")
    if not torch.isfinite(x[counted]).all():
        raise GRPOError(f"{name} has non-finite values on counted tokens")
    return torch.where(counted, x, torch.zeros((), dtype=x.dtype))


def grpo_token_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: GRPOConfig,
    *,
    logp_ref: Tensor | None = None,
    entropy: Tensor | None = None,
) -> LossOutput:
    """The GRPO loss over a batch of B completions padded to T tokens (formulas in the module docstring).

    logp_new (B, T): log-probs of the generated tokens under the policy being trained (with grad).
    logp_old (B, T): the same under the policy that generated them; treated as a constant.
    advantages (B,): one per completion, broadcast over its tokens.
    mask (B, T): bool or 0/1, true for completion tokens that count; other positions may hold anything.
    logp_ref (B, T): reference-policy log-probs for the k3 KL `exp(ref - new) - (ref - new) - 1`.
    entropy (B, T): per-token entropy of the policy for the bonus.

    Normalisation is per token over the whole batch (sum / counted tokens), not a mean of per-sequence means:
    every token weighs the same, so a long completion's tokens are not down-weighted against a short one's.
    """
    if logp_new.dim() != 2:
        raise GRPOError(f"logp_new must be (B, T), got shape {tuple(logp_new.shape)}")
    B, T = logp_new.shape  # batch, time
    if mask.shape != logp_new.shape:
        raise GRPOError(f"mask must have shape {(B, T)} like logp_new, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool and not ((mask == 0) | (mask == 1)).all():
        raise GRPOError("mask must be bool or hold only 0 and 1")
    counted = mask.to(torch.bool)  # (B, T)
    tokens = int(counted.sum())
    if tokens == 0:
        raise GRPOError("mask counts no tokens; the loss would be 0/0")
    if advantages.shape != (B,):
        raise GRPOError(f"advantages must have shape {(B,)}, got {tuple(advantages.shape)}")
    if not torch.isfinite(advantages).all():
        raise GRPOError(f"advantages must be finite, got {advantages.tolist()}")

    # float32 whatever the compute dtype: bfloat16 keeps 3 significant digits, exp(new - old) would be off by percents
    new = _check_tokens("logp_new", logp_new.float(), logp_new.shape, counted)  # (B, T)
    old = _check_tokens("logp_old", logp_old.detach().float(), logp_new.shape, counted)  # (B, T)
    adv = advantages.detach().to(new.dtype).unsqueeze(1)  # (B, 1), broadcast over T

    ratio = torch.exp(new - old)  # (B, T)
    unclipped = ratio * adv
    capped = torch.clamp(ratio, max=cfg.delta) * adv
    clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high) * adv
    chosen = torch.minimum(capped, clipped)  # (B, T)
    loss_tok = -chosen

    kl_mean = 0.0
    if logp_ref is not None:
        ref = _check_tokens("logp_ref", logp_ref.detach().float(), logp_new.shape, counted)
        kl_tok = torch.exp(ref - new) - (ref - new) - 1  # (B, T), k3: >= 0, unbiased for KL(new || ref)
        loss_tok = loss_tok + cfg.kl_coef * kl_tok
        kl_mean = kl_tok.detach()[counted].mean().item()
    entropy_mean = 0.0
    if entropy is not None:
        ent = _check_tokens("entropy", entropy.float(), logp_new.shape, counted)
        loss_tok = loss_tok - cfg.entropy_coef * ent
        entropy_mean = ent.detach()[counted].mean().item()

    loss = torch.where(counted, loss_tok, torch.zeros((), dtype=loss_tok.dtype)).sum() / tokens
    with torch.no_grad():
        # exact float comparison is sound: when no clip is active, `chosen` is computed by the same ops as `unclipped`
        was_clipped = (chosen != unclipped)[counted]
        return LossOutput(
            loss=loss,
            clipped_fraction=float(was_clipped.float().mean()),
            mean_ratio=float(ratio[counted].mean()),
            kl=kl_mean,
            entropy=entropy_mean,
            tokens=tokens,
        )
