"""The seeded Gumbel-max sampler: its noise, its distribution, and the validator's re-check."""

from __future__ import annotations

import math

import pytest
import torch

from engine.inference.sampler import (
    SamplingParams,
    SamplingParamsError,
    check_logprobs,
    check_sampled,
    gumbel_noise,
    nucleus_mask,
    sample_tokens,
    seed_to_int64,
    uniform_noise,
)

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _mix_reference(z: int) -> int:
    """splitmix64's finaliser on Python ints, written independently of the torch version."""
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _uniform_reference(seed: int, position: int, token: int) -> float:
    key = _mix_reference(_mix_reference(seed + GAMMA) + (position + 1) * GAMMA)
    bits = _mix_reference(key + (token + 1) * GAMMA) >> 12
    return (bits + 0.5) / 2.0**52


def _draws(logits: torch.Tensor, params: SamplingParams, n: int) -> torch.Tensor:
    """n tokens from one row of logits, one per seed, at output position 3."""
    tokens, _ = sample_tokens(
        logits.expand(n, -1), torch.arange(n, dtype=torch.int64), torch.full((n,), 3, dtype=torch.int64), params
    )
    return tokens


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def test_noise_matches_the_reference_splitmix64_hash() -> None:
    seeds = [0, 1, 2**62 + 12345, -1, -(2**63), 2**63 - 1]
    for seed in seeds:
        u = uniform_noise(torch.tensor([seed]), torch.tensor([7]), 5)[0]
        assert u.tolist() == [_uniform_reference(seed, 7, t) for t in range(5)]


def test_noise_is_a_pure_function_of_seed_position_and_token() -> None:
    seeds = torch.tensor([11, 11, 12, 11], dtype=torch.int64)
    positions = torch.tensor([4, 4, 4, 5], dtype=torch.int64)
    u = uniform_noise(seeds, positions, 50)  # (4, 50)
    assert torch.equal(u[0], u[1])
    assert (u[0] != u[2]).all()  # another seed
    assert (u[0] != u[3]).all()  # another position
    assert u[0].unique().numel() == 50  # another token
    assert torch.equal(uniform_noise(seeds, positions, 20), u[:, :20])  # a token's noise ignores the vocab size


def test_noise_lies_strictly_inside_the_unit_interval() -> None:
    seeds = torch.tensor([0, -1, 2**63 - 1, -(2**63)], dtype=torch.int64).repeat_interleave(64)
    positions = torch.arange(256, dtype=torch.int64)
    u = uniform_noise(seeds, positions, 4096)  # (256, 4096)
    assert u.dtype == torch.float64
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 1e-3
    assert torch.isfinite(gumbel_noise(u)).all()
    extremes = torch.tensor([2.0**-53, 1 - 2.0**-53], dtype=torch.float64)
    assert torch.isfinite(gumbel_noise(extremes)).all()


@pytest.mark.gpu
def test_noise_and_samples_are_identical_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    seeds = torch.arange(-8, 8, dtype=torch.int64) * (2**59 + 7)
    positions = torch.arange(16, dtype=torch.int64) * 1000
    u_cpu = uniform_noise(seeds, positions, 151_936)
    u_gpu = uniform_noise(seeds.cuda(), positions.cuda(), 151_936).cpu()
    assert torch.equal(u_cpu, u_gpu)
    logits = torch.randn(16, 151_936, generator=torch.Generator().manual_seed(0)) * 4
    params = SamplingParams(temperature=0.8, top_p=0.95)
    tokens_cpu, _ = sample_tokens(logits, seeds, positions, params)
    tokens_gpu, _ = sample_tokens(logits.cuda(), seeds.cuda(), positions.cuda(), params)
    assert torch.equal(tokens_cpu, tokens_gpu.cpu())


def test_gumbel_max_draws_follow_softmax_of_the_scaled_logits() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    params = SamplingParams(temperature=0.7)
    tokens = _draws(logits, params, 5000)
    probs = torch.softmax(logits[0] / 0.7, dim=-1)
    assert _chi_square(tokens, probs) < 18.5  # 4 degrees of freedom: p = 0.001
    along_a_row, _ = sample_tokens(logits.expand(5000, -1), torch.full((5000,), 7), torch.arange(5000), params)
    assert _chi_square(along_a_row, probs) < 18.5  # one seed, successive positions


def test_top_p_draws_follow_the_renormalised_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.07, 0.03]]))
    tokens = _draws(logits, SamplingParams(temperature=1.0, top_p=0.85), 5000)
    assert set(tokens.tolist()) == {0, 1, 2}
    assert _chi_square(tokens, torch.tensor([4, 3, 2]) / 9) < 13.8  # 2 degrees of freedom: p = 0.001


def test_tiny_top_p_and_zero_temperature_are_greedy() -> None:
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(1))
    seeds, positions = torch.arange(64), torch.zeros(64, dtype=torch.int64)
    for params in (SamplingParams(temperature=1.5, top_p=1e-6), SamplingParams(temperature=0.0)):
        tokens, logprobs = sample_tokens(logits, seeds, positions, params)
        assert torch.equal(tokens, logits.argmax(-1))
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1).max(-1).values)


def test_sampled_logprobs_are_log_softmax_of_the_scaled_logits_over_the_whole_vocabulary() -> None:
    logits = torch.randn(8, 30, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=0.6, top_p=0.5)
    tokens, logprobs = sample_tokens(logits, torch.arange(8), torch.arange(8), params)
    expected = torch.log_softmax(logits / 0.6, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(logprobs, expected)


def test_nucleus_keeps_the_smallest_set_that_reaches_top_p() -> None:
    scaled = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    kept = {top_p: nucleus_mask(scaled, top_p)[0].nonzero().flatten().tolist() for top_p in (0.45, 0.55, 0.85, 0.99)}
    assert kept == {0.45: [1], 0.55: [1, 3], 0.85: [0, 1, 3], 0.99: [0, 1, 2, 3]}


def test_nucleus_breaks_ties_towards_the_lower_token_id() -> None:
    scaled = torch.zeros(1, 4)
    assert nucleus_mask(scaled, 0.2)[0].tolist() == [True, False, False, False]
    assert nucleus_mask(scaled, 0.3)[0].tolist() == [True, True, False, False]
    assert nucleus_mask(scaled, 0.6)[0].tolist() == [True, True, True, False]
    assert nucleus_mask(torch.tensor([[0.0, 1.0, 1.0]]), 0.1)[0].tolist() == [False, True, False]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", math.inf),
        ("temperature", math.nan),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_p", math.nan),
        ("max_tokens", 0),
        ("max_tokens", 2.5),
    ],
)
def test_sampling_params_reject_out_of_range_values(field: str, value: float) -> None:
    with pytest.raises(SamplingParamsError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_seeds_wrap_modulo_2_64_into_int64() -> None:
    assert seed_to_int64(2**64 - 1) == -1
    assert seed_to_int64(2**63) == -(2**63)
    assert seed_to_int64(-5) == -5
    assert seed_to_int64(2**64 + 9) == 9


class TestCheckSampled:
    """A validator's re-check of one row from its prefill logits."""

    params = SamplingParams(temperature=0.8, top_p=0.9)
    seed = 1234

    def honest(self, params: SamplingParams | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        params = params or self.params
        logits = torch.randn(40, 64, generator=torch.Generator().manual_seed(3)) * 3  # (N, V)
        positions = torch.arange(40, dtype=torch.int64)
        tokens, _ = sample_tokens(logits, torch.full((40,), self.seed), positions, params)
        return logits, tokens, positions

    def test_accepts_honest_tokens(self) -> None:
        logits, tokens, positions = self.honest()
        assert check_sampled(logits, tokens, self.seed, positions, self.params).ok

    def test_accepts_honest_greedy_tokens(self) -> None:
        greedy = SamplingParams(temperature=0.0)
        logits, tokens, positions = self.honest(greedy)
        assert check_sampled(logits, tokens, self.seed, positions, greedy).ok
        assert not check_sampled(logits, (tokens + 1) % 64, self.seed, positions, greedy).ok

    def test_rejects_a_changed_token_at_its_position(self) -> None:
        logits, tokens, positions = self.honest()
        forged = tokens.clone()
        forged[17] = (forged[17] + 1) % 64
        verdict = check_sampled(logits, forged, self.seed, positions, self.params)
        assert (verdict.ok, verdict.first_bad_position) == (False, 17)
        assert f"token {int(forged[17])}" in verdict.detail

    def test_rejects_another_temperature_seed_or_top_p(self) -> None:
        logits, tokens, positions = self.honest()
        assert not check_sampled(logits, tokens, self.seed, positions, SamplingParams(temperature=1.0, top_p=0.9)).ok
        assert not check_sampled(logits, tokens, self.seed + 1, positions, self.params).ok
        assert not check_sampled(logits, tokens, self.seed, positions + 1, self.params).ok
        assert not check_sampled(logits, tokens, self.seed, positions, SamplingParams(temperature=0.8, top_p=0.3)).ok

    def test_flags_tokens_outside_the_nucleus(self) -> None:
        logits, tokens, positions = self.honest(SamplingParams(temperature=0.8))
        narrow = SamplingParams(temperature=0.8, top_p=0.05)
        verdict = check_sampled(logits, tokens, self.seed, positions, narrow)
        assert not verdict.ok and "nucleus" in verdict.detail

    def test_margin_absorbs_float_noise_in_the_validators_logits(self) -> None:
        logits, tokens, positions = self.honest()
        noisy = logits + 1e-5 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(4))
        assert check_sampled(noisy, tokens, self.seed, positions, self.params, margin=1e-3).ok

    def test_rejects_out_of_vocabulary_tokens_without_raising(self) -> None:
        logits, tokens, positions = self.honest()
        forged = tokens.clone()
        forged[5] = 64
        verdict = check_sampled(logits, forged, self.seed, positions, self.params)
        assert (verdict.ok, verdict.first_bad_position) == (False, 5)

    @pytest.mark.parametrize("top_p", [1.0, 0.999, 0.9, 0.5])
    @pytest.mark.parametrize("margin", [0.0, 1e-3, 0.3])
    def test_deciding_without_the_rival_sort_gives_every_verdict_the_exact_gaps_give(
        self, top_p: float, margin: float
    ) -> None:
        """`check_sampled` skips the nucleus sort for rows within the margin of the best of every id; over honest,
        noisy and forged rows its pass or fail is the one the exact gaps (`_gaps` without the shortcut) give, and a row
        failing by its gap has the exact one."""
        from engine.inference.sampler import _gaps

        params = SamplingParams(temperature=0.8, top_p=top_p)
        generator = torch.Generator().manual_seed(int(top_p * 1000 + margin * 10))
        for trial in range(12):
            logits, tokens, positions = self.honest(params)
            logits = logits + 0.3 * torch.randn(logits.shape, generator=generator) * (trial % 3)  # noise 0, 0.3, 0.6
            forged = tokens.clone()
            changed = torch.randint(0, 40, (trial % 5,), generator=generator)
            forged[changed] = torch.randint(0, 64, changed.shape, generator=generator)
            exact_gap, exact_best, exact_in = _gaps(logits, forged, self.seed, positions, params, margin)
            gap, best, in_nucleus = _gaps(logits, forged, self.seed, positions, params, margin, decide_only=True)
            exact_bad, bad = ~exact_in | (exact_gap > margin), ~in_nucleus | (gap > margin)
            assert torch.equal(bad, exact_bad) and torch.equal(in_nucleus, exact_in)
            by_gap = in_nucleus & (gap > margin)  # a row outside the nucleus fails for that, whatever its gap
            assert torch.equal(gap[by_gap], exact_gap[by_gap]) and torch.equal(best[by_gap], exact_best[by_gap])
            assert bool((gap >= exact_gap).all())  # a skipped row reports an upper bound
            verdict = check_sampled(logits, forged, self.seed, positions, params, margin=margin)
            first = int(torch.nonzero(exact_bad)[0, 0]) if bool(exact_bad.any()) else None
            assert (verdict.ok, verdict.first_bad_position) == (first is None, first)


def test_check_logprobs_accepts_recorded_logprobs_and_rejects_bent_ones() -> None:
    logits = torch.randn(20, 32, generator=torch.Generator().manual_seed(5))
    params = SamplingParams(temperature=0.5)
    tokens, logprobs = sample_tokens(logits, torch.full((20,), 9), torch.arange(20), params)
    assert check_logprobs(logits, tokens, logprobs, params, atol=1e-5).ok
    assert check_logprobs(logits, tokens, logprobs.tolist(), params, atol=1e-5).ok
    assert not check_logprobs(logits, tokens, logprobs, SamplingParams(temperature=1.0), atol=1e-5).ok
    bent = logprobs.clone()
    bent[8] += 1e-3
    verdict = check_logprobs(logits, tokens, bent, params, atol=1e-5)
    assert (verdict.ok, verdict.first_bad_position) == (False, 8)
    bent[8] = math.nan
    assert not check_logprobs(logits, tokens, bent, params, atol=1e-5).ok
