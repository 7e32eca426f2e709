"""The GRPO loss against hand-computed values: advantages, the group filter, both clip branches, the delta cap,
token-level normalisation, KL, entropy, and the errors.

Ratios are set through logp_old = 0 and logp_new = ln(ratio). With one counted token the loss is that token's
loss and d loss / d logp_new = d loss / d ratio * ratio.
"""

from __future__ import annotations

import math

import pytest
import torch

from trainer.errors import TrainerError
from trainer.grpo import GRPOConfig, GRPOError, group_advantages, grpo_token_loss, keep_group

CFG = GRPOConfig()  # eps_low = eps_high = 0.2, delta = 4


def one_token(ratio: float, advantage: float, cfg: GRPOConfig = CFG) -> tuple[float, float]:
    """(loss, d loss / d logp_new) for a single counted token with the given ratio and advantage."""
    logp_new = torch.tensor([[math.log(ratio)]], requires_grad=True)
    out = grpo_token_loss(logp_new, torch.zeros(1, 1), torch.tensor([advantage]), torch.ones(1, 1), cfg)
    out.loss.backward()
    assert logp_new.grad is not None
    return out.loss.item(), float(logp_new.grad[0, 0])


# --- advantages and the online filter ---


def test_advantages_use_population_std() -> None:
    # mean 5; squared deviations 9,1,1,1,0,0,4,16 sum to 32; population var 32/8 = 4, std 2
    # (the sample std would be sqrt(32/7) = 2.138..., giving -1.403... for the first reward)
    rewards = torch.tensor([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    expected = [-3 / 2.000001, -1 / 2.000001, -1 / 2.000001, -1 / 2.000001, 0.0, 0.0, 2 / 2.000001, 4 / 2.000001]
    assert group_advantages(rewards).tolist() == pytest.approx(expected, abs=1e-6)


def test_advantages_of_a_single_completion_are_zero() -> None:
    assert group_advantages(torch.tensor([0.7])).tolist() == [0.0]


def test_all_equal_group_dropped_and_mixed_group_kept() -> None:
    assert not keep_group(torch.tensor([1.0, 1.0, 1.0, 1.0]))
    assert keep_group(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    groups = [torch.tensor([0.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5]), torch.tensor([0.2, 0.3])]
    assert [i for i, rewards in enumerate(groups) if keep_group(rewards)] == [1, 3]


def test_filter_compares_rewards_exactly() -> None:
    assert keep_group(torch.tensor([1.0, 1.0 + 2**-20]))


# --- the clip branches (eps = 0.2, delta = 4) ---


def test_positive_advantage_above_band_is_clipped_with_zero_gradient() -> None:
    # ratio 1.5, A = 2: min(min(1.5, 4) * 2, 1.2 * 2) = 2.4, loss -2.4
    loss, grad = one_token(1.5, 2.0)
    assert loss == pytest.approx(-2.4, abs=1e-6)
    assert grad == 0.0


def test_positive_advantage_inside_band_is_unclipped() -> None:
    # ratio 1.1, A = 2: min(2.2, 2.2) = 2.2, loss -2.2, gradient -A * ratio = -2.2
    loss, grad = one_token(1.1, 2.0)
    assert loss == pytest.approx(-2.2, abs=1e-6)
    assert grad == pytest.approx(-2.2, abs=1e-6)


def test_positive_advantage_below_band_is_not_clipped() -> None:
    # ratio 0.5, A = 2: min(0.5 * 2, 0.8 * 2) = 1.0, loss -1.0; the lower clip never binds for A > 0
    loss, grad = one_token(0.5, 2.0)
    assert loss == pytest.approx(-1.0, abs=1e-6)
    assert grad == pytest.approx(-1.0, abs=1e-6)


def test_negative_advantage_below_band_is_clipped_with_zero_gradient() -> None:
    # ratio 0.5, A = -2: min(0.5 * -2, 0.8 * -2) = min(-1.0, -1.6) = -1.6, loss 1.6
    loss, grad = one_token(0.5, -2.0)
    assert loss == pytest.approx(1.6, abs=1e-6)
    assert grad == 0.0


def test_negative_advantage_between_band_and_delta_is_unclipped() -> None:
    # ratio 3, A = -2: min(min(3, 4) * -2, 1.2 * -2) = min(-6, -2.4) = -6, loss 6, gradient -A * ratio = 6
    loss, grad = one_token(3.0, -2.0)
    assert loss == pytest.approx(6.0, abs=1e-5)
    assert grad == pytest.approx(6.0, abs=1e-5)


def test_delta_caps_negative_advantage_with_large_ratio() -> None:
    # ratio 10, A = -2: min(min(10, 4) * -2, 1.2 * -2) = min(-8, -2.4) = -8: the capped term wins, loss 8
    # (delta * |A|, not the 20 that ratio * |A| would give), and the gradient is zero
    loss, grad = one_token(10.0, -2.0)
    assert loss == pytest.approx(8.0, abs=1e-5)
    assert grad == 0.0


def test_delta_is_configurable() -> None:
    # ratio 10, A = -1, delta 2: min(2 * -1, 1.2 * -1) = -2, loss 2
    loss, grad = one_token(10.0, -1.0, GRPOConfig(delta=2.0))
    assert loss == pytest.approx(2.0, abs=1e-6)
    assert grad == 0.0


def test_asymmetric_band() -> None:
    # eps_low 0.1, eps_high 0.3: ratio 1.25 with A = 1 is inside [0.9, 1.3] (loss -1.25), ratio 0.85 with
    # A = -1 is below it (min(-0.85, -0.9) = -0.9, loss 0.9)
    cfg = GRPOConfig(eps_low=0.1, eps_high=0.3)
    assert one_token(1.25, 1.0, cfg)[0] == pytest.approx(-1.25, abs=1e-6)
    assert one_token(0.85, -1.0, cfg) == pytest.approx((0.9, 0.0), abs=1e-6)


def test_clipped_fraction_counts_clip_and_delta_over_counted_tokens() -> None:
    # row 0 (A = 1): ratio 1.5 clipped, 1.0 inside, 0.5 inside (lower clip not active for A > 0)
    # row 1 (A = -1): ratio 0.5 clipped, 10 delta-capped, 1.5 uncounted (would be inside)
    ratios = torch.tensor([[1.5, 1.0, 0.5], [0.5, 10.0, 1.5]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    out = grpo_token_loss(ratios.log(), torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask, CFG)
    assert out.tokens == 5
    assert out.clipped_fraction == pytest.approx(3 / 5)
    assert out.mean_ratio == pytest.approx((1.5 + 1.0 + 0.5 + 0.5 + 10.0) / 5, abs=1e-6)
    # token losses: -1.2, -1.0, -0.5, 0.8, 4.0 -> sum 2.1 over 5 tokens
    assert out.loss.item() == pytest.approx(2.1 / 5, abs=1e-6)
    assert out.kl == 0.0 and out.entropy == 0.0


def test_advantage_zero_gives_zero_loss_and_no_clipping() -> None:
    out = grpo_token_loss(torch.tensor([[2.0]]), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), CFG)
    assert out.loss.item() == 0.0
    assert out.clipped_fraction == 0.0


# --- normalisation and masking ---


def test_loss_is_normalised_over_tokens_not_sequences() -> None:
    # ratio 1 everywhere, so each token's loss is -A. Row 0 (A = 2) has 1 token, row 1 (A = 1) has 3.
    # Per token: (-2 - 1 - 1 - 1) / 4 = -1.25. A mean of per-sequence means would be (-2 + -1) / 2 = -1.5.
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    out = grpo_token_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([2.0, 1.0]), mask, CFG)
    assert out.tokens == 4
    assert out.loss.item() == pytest.approx(-1.25)
    assert out.loss.item() != pytest.approx(-1.5)


def test_uncounted_tokens_contribute_nothing() -> None:
    mask = torch.tensor([[True, False], [True, True]])
    adv = torch.tensor([1.0, -1.0])
    base = torch.tensor([[0.1, 0.0], [-0.1, 0.05]])
    garbage = torch.tensor([[0.1, float("nan")], [-0.1, 0.05]])
    huge_old = torch.tensor([[0.0, -1e4], [0.0, 0.0]])
    reference = grpo_token_loss(base, torch.zeros(2, 2), adv, mask, CFG)
    for logp_new, logp_old in ((garbage, torch.zeros(2, 2)), (base, huge_old)):
        logp_new = logp_new.clone().requires_grad_(True)
        out = grpo_token_loss(logp_new, logp_old, adv, mask, CFG)
        assert out.loss.item() == pytest.approx(reference.loss.item())
        out.loss.backward()
        assert logp_new.grad is not None
        assert logp_new.grad[0, 1] == 0.0
        assert torch.isfinite(logp_new.grad).all()


# --- KL and entropy ---


def test_k3_kl_for_known_log_ratios() -> None:
    # ratio 1 and A = 0, so only the KL term is left. ref - new = ln 2: 2 - ln 2 - 1 = 0.30685282;
    # ref - new = -1: e^-1 + 1 - 1 = 0.36787944. Mean 0.33736613; with kl_coef 0.5 the loss is 0.16868307.
    logp_ref = torch.tensor([[math.log(2.0), -1.0]])
    cfg = GRPOConfig(kl_coef=0.5)
    out = grpo_token_loss(
        torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2), cfg, logp_ref=logp_ref
    )
    assert out.kl == pytest.approx(0.33736613, abs=1e-6)
    assert out.loss.item() == pytest.approx(0.16868307, abs=1e-6)


def test_kl_is_reported_but_not_added_when_coef_is_zero() -> None:
    logp_ref = torch.tensor([[math.log(2.0)]])
    out = grpo_token_loss(
        torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), CFG, logp_ref=logp_ref
    )
    assert out.kl == pytest.approx(0.30685282, abs=1e-6)
    assert out.loss.item() == 0.0


def test_entropy_bonus_lowers_loss_by_coef_times_mean_entropy() -> None:
    # ratio 1, A = 1: policy loss -1 per token. Entropies 0.5 and 1.5 (mean 1.0), coef 0.1: loss -1.1.
    cfg = GRPOConfig(entropy_coef=0.1)
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), cfg)
    without = grpo_token_loss(*args)
    with_bonus = grpo_token_loss(*args, entropy=torch.tensor([[0.5, 1.5]]))
    assert without.loss.item() == pytest.approx(-1.0)
    assert with_bonus.loss.item() == pytest.approx(-1.1)
    assert with_bonus.entropy == pytest.approx(1.0)


# --- errors ---


@pytest.mark.parametrize(
    "kwargs",
    [{"eps_low": -0.1}, {"eps_low": 1.0}, {"eps_high": -0.1}, {"delta": 1.0}, {"kl_coef": -1.0}, {"delta": math.inf}],
)
def test_config_rejects_out_of_bounds(kwargs: dict[str, float]) -> None:
    with pytest.raises(GRPOError):
        GRPOConfig(**kwargs)


def test_errors_derive_from_trainer_error() -> None:
    assert issubclass(GRPOError, TrainerError)


@pytest.mark.parametrize(
    ("logp_new", "logp_old", "advantages", "mask"),
    [
        (torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3)),  # logp_old shape
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3)),  # advantages length
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(3, 2)),  # mask shape
        (torch.zeros(6), torch.zeros(6), torch.zeros(1), torch.ones(6)),  # not (B, T)
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 3)),  # nothing counted
        (torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.full((2, 3), 0.5)),  # mask not 0/1
        (torch.tensor([[0.0, math.nan]]), torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2)),  # NaN counted
        (torch.zeros(1, 2), torch.tensor([[math.inf, 0.0]]), torch.zeros(1), torch.ones(1, 2)),  # inf counted
        (torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([math.nan]), torch.ones(1, 2)),  # NaN advantage
    ],
)
def test_loss_rejects_bad_inputs(
    logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> None:
    with pytest.raises(GRPOError):
        grpo_token_loss(logp_new, logp_old, advantages, mask, CFG)


def test_loss_rejects_misshapen_ref_and_entropy() -> None:
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2), CFG)
    with pytest.raises(GRPOError):
        grpo_token_loss(*args, logp_ref=torch.zeros(1, 3))
    with pytest.raises(GRPOError):
        grpo_token_loss(*args, entropy=torch.tensor([[0.0, math.nan]]))


@pytest.mark.parametrize("rewards", [torch.tensor([]), torch.zeros(2, 2), torch.tensor([1.0, math.nan])])
def test_advantages_reject_bad_rewards(rewards: torch.Tensor) -> None:
    with pytest.raises(GRPOError):
        group_advantages(rewards)
