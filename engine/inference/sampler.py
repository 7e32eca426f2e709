"""Seeded Gumbel-max sampling that a validator can re-check from prefill logits (DESIGN section 7).

The worker's only freedom is the logits: the noise is a pure function of (seed, output position, token id)
computed with int64 torch ops, identical on every device, so a validator that recomputes the logits also
recomputes the choice. `sample_tokens` (worker) and `check_sampled` (validator) share `_scaled`,
`_nucleus` and `gumbel_noise`, so they cannot drift apart.

Convention, for row seed s and output position i (0-based index into the completion):
    u = hash(s, i, token) in (0, 1),  g = -log(-log(u))
    T > 0: token = argmax over the top-p nucleus of softmax(logits / T) of (logits / T + g)
    T = 0: token = argmax(logits)
    logprob = log_softmax(logits / T)[token]   (T = 0: log_softmax(logits)[token])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.inference.errors import InferenceError

_MASK64 = (1 << 64) - 1
# splitmix64 constants (Steele, Lea, Flood 2014), as signed int64 so torch accepts them.
_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)
_MUL1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MUL2 = 0x94D049BB133111EB - (1 << 64)
_MANTISSA_BITS = 52  # k + 0.5 with k < 2**52 is exact in float64's 53-bit significand, so u never rounds to 1


class SamplingParamsError(InferenceError, ValueError):
    """A sampling parameter is out of its range."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        super().__init__(f"SamplingParams.{name} must be {rule}, got {value!r}")
        self.name = name
        self.value = value


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn; recorded in the rollout file so a validator checks against the same values."""

    temperature: float = 1.0  # >= 0; 0 means greedy argmax
    top_p: float = 1.0  # in (0, 1]; 1 keeps the whole vocabulary
    max_tokens: int = 256  # >= 1 output tokens per completion, EOS included

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise SamplingParamsError("temperature", self.temperature, "a finite number >= 0")
        if isinstance(self.top_p, bool) or not (0.0 < self.top_p <= 1.0):  # also rejects NaN
            raise SamplingParamsError("top_p", self.top_p, "in (0, 1]")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SamplingParamsError("max_tokens", self.max_tokens, "an integer >= 1")


@dataclass(frozen=True)
class SamplingCheck:
    """A validator's verdict on a row's tokens; `first_bad_position` is the output position that failed."""

    ok: bool
    first_bad_position: int | None
    detail: str


def seed_to_int64(seed: int) -> int:
    """Any Python int taken modulo 2**64 as a signed int64, the dtype the noise hash and rollout files use."""
    seed &= _MASK64
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic: it copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser; int64 products wrap modulo 2**64 on every torch device."""
    z = (z ^ _shr(z, 30)) * _MUL1
    z = (z ^ _shr(z, 27)) * _MUL2
    return z ^ _shr(z, 31)


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B,), (B,) int64 -> (B, V) float64 in the open interval (0, 1), a pure function of (seed, position, token).

    A splitmix64 stream: the row key mixes the seed then the position, and token t draws output t + 1 of
    the stream keyed there. The top 52 bits k map to (k + 0.5) / 2**52, so u is in [2**-53, 1 - 2**-53].
    """
    seeds = seeds.to(torch.int64).reshape(-1, 1)  # (B, 1)
    positions = positions.to(device=seeds.device, dtype=torch.int64).reshape(-1, 1)  # (B, 1)
    if seeds.shape != positions.shape:
        raise InferenceError(f"uniform_noise: {seeds.shape[0]} seeds but {positions.shape[0]} positions")
    key = _mix64(_mix64(seeds + _GAMMA) + (positions + 1) * _GAMMA)  # (B, 1)
    tokens = torch.arange(1, vocab + 1, dtype=torch.int64, device=seeds.device).unsqueeze(0)  # (1, V)
    bits = _shr(_mix64(key + tokens * _GAMMA), 64 - _MANTISSA_BITS)  # (B, V) in [0, 2**52)
    return (bits.to(torch.float64) + 0.5) * (2.0**-_MANTISSA_BITS)


def gumbel_noise(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise -log(-log(u)) in float64; finite because u is never 0 or 1."""
    return -torch.log(-torch.log(u.to(torch.float64)))


def nucleus_mask(logits_scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """(B, V) -> bool (B, V): the smallest set of most probable tokens whose mass reaches top_p.

    Tokens are ranked by probability, equal probabilities by lower token id, so the set is unique; the
    most probable token is always kept.
    """
    if not 0.0 < top_p <= 1.0:
        raise SamplingParamsError("top_p", top_p, "in (0, 1]")
    return _nucleus(logits_scaled, top_p)


def _nucleus(logits_scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """`nucleus_mask` for any top_p: <= 0 keeps only the most probable token, >= 1 keeps all."""
    if top_p >= 1.0:
        return torch.ones_like(logits_scaled, dtype=torch.bool)
    probs = torch.softmax(logits_scaled.float(), dim=-1)  # (B, V)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # ties: lower id first
    sorted64 = sorted_probs.double()
    mass_before = torch.cumsum(sorted64, dim=-1) - sorted64  # (B, V) mass of strictly better-ranked tokens
    keep_sorted = mass_before < top_p
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T in float32 (T = 0: the logits unscaled, for the greedy path's log-probs)."""
    logits = logits.float()
    return logits / temperature if temperature > 0 else logits


def _perturbed(scaled: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, V) float64 Gumbel-perturbed scores logits / T + g."""
    return scaled.double() + gumbel_noise(uniform_noise(seeds, positions, scaled.shape[-1]))


def sample_tokens(
    logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) logits, (B,) int64 seeds and output positions -> (B,) int64 tokens, (B,) float32 log-probs."""
    if logits.dim() != 2:
        raise InferenceError(f"sample_tokens: logits must be (B, V), got shape {tuple(logits.shape)}")
    scaled = _scaled(logits, params.temperature)  # (B, V)
    if params.temperature == 0:
        tokens = torch.argmax(scaled, dim=-1)  # first index among exact ties
    else:
        scores = _perturbed(scaled, seeds.to(logits.device), positions.to(logits.device))  # (B, V)
        scores = scores.masked_fill(~_nucleus(scaled, params.top_p), -math.inf)
        tokens = torch.argmax(scores, dim=-1)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B,)
    return tokens, logprobs


def check_sampled(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    positions: torch.Tensor,
    params: SamplingParams,
    margin: float = 0.0,
) -> SamplingCheck:
    """Re-checks one row: each claimed token must be the seeded Gumbel-max choice the params allow.

    `logits` (N, V) are the validator's prefill logits that sampled tokens (N,) at output `positions` (N,).
    `margin` absorbs float differences between the worker's decode and the validator's prefill: a token
    passes if its perturbed score is within `margin` of the best one (score units: logits / T, so logits
    at T = 0) and, for the nucleus, if it lies in the nucleus of top_p + margin while rivals are taken from
    the nucleus of top_p - margin. With margin 0 the check is exactly `sample_tokens`.
    """
    n = _check_rows("check_sampled", logits, tokens)
    if positions.shape != (n,):
        raise InferenceError(f"check_sampled: positions must have shape ({n},), got {tuple(positions.shape)}")
    if n == 0:
        return SamplingCheck(ok=True, first_bad_position=None, detail="no tokens")
    tokens = tokens.to(device=logits.device, dtype=torch.int64)
    if (outside := _out_of_vocab(tokens, logits.shape[-1], positions)) is not None:
        return outside
    gap, expected, in_nucleus = _gaps(logits, tokens, seed, positions, params, margin, decide_only=True)
    bad = ~in_nucleus | (gap > margin)
    if not bool(bad.any()):
        return SamplingCheck(ok=True, first_bad_position=None, detail=f"{n} tokens match")
    i = int(torch.nonzero(bad)[0, 0])
    position, token = int(positions[i]), int(tokens[i])
    where = f"output position {position}: token {token}"
    setting = f"temperature {params.temperature}, top_p {params.top_p}, seed {seed}"
    if not bool(in_nucleus[i]):
        detail = f"{where} is outside the top-p nucleus ({setting})"
    else:
        detail = (
            f"{where} is not the seeded choice ({setting}): token {int(expected[i])} scores "
            f"{float(gap[i]):.3g} higher, margin {margin}"
        )
    return SamplingCheck(ok=False, first_bad_position=position, detail=detail)


def _gaps(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    positions: torch.Tensor,
    params: SamplingParams,
    margin: float,
    *,
    decide_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N,) each claimed token's perturbed score below the best rival's (0 when it is the choice), the best
    rival, and whether the claimed token lies in the nucleus of top_p + margin (rivals from top_p - margin).

    Rivals come from a nucleus, which takes a sort of the whole vocabulary per row: seconds a file at Qwen's
    151,936 ids, where the worker at top_p = 1 sorted nothing. A token within `margin` of the best of every id is
    within it of the best of any subset of them, so with `decide_only` such a row skips the sort and reports its
    gap to the best of every id (an upper bound of the exact gap): the same pass or fail, exact gaps for the
    rows that fail."""
    scaled = _scaled(logits, params.temperature)  # (N, V)
    claimed = tokens.unsqueeze(-1)  # (N, 1)
    if params.temperature == 0:
        scores = scaled.double()
        in_nucleus = torch.ones(tokens.shape[0], dtype=torch.bool, device=logits.device)
        best, expected = scores.max(dim=-1)  # (N,)
        return best - scores.gather(-1, claimed).squeeze(-1), expected, in_nucleus
    seeds = torch.full(tokens.shape, seed_to_int64(seed), dtype=torch.int64, device=logits.device)
    scores = _perturbed(scaled, seeds, positions.to(logits.device))  # (N, V)
    own = scores.gather(-1, claimed).squeeze(-1)  # (N,)
    in_nucleus = _nucleus(scaled, params.top_p + margin).gather(-1, claimed).squeeze(-1)  # (N,)
    best, expected = scores.max(dim=-1)  # the rivals when the nucleus holds every id (top_p - margin >= 1)
    if params.top_p - margin < 1.0:
        rows = best - own > margin if decide_only else torch.ones_like(own, dtype=torch.bool)
        if bool(rows.any()):
            rivals = scores[rows].masked_fill(~_nucleus(scaled[rows], params.top_p - margin), -math.inf)
            best[rows], expected[rows] = rivals.max(dim=-1)
    return best - own, expected, in_nucleus  # gap >= 0 unless out-ranked


def claimed_gaps(
    logits: torch.Tensor, tokens: torch.Tensor, seed: int, positions: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
    """(N,) how far each claimed token's seeded score is below the best one: 0 for the exact choice, a few 1e-6
    for an honest token recomputed elsewhere, inf for a token outside the top-p nucleus; `check_sampled` allows up
    to its margin (calibration and the validator's evidence read this)."""
    n = _check_rows("claimed_gaps", logits, tokens)
    if n == 0:
        return torch.zeros(0, dtype=torch.float64)
    tokens = tokens.to(device=logits.device, dtype=torch.int64)
    gap, _, in_nucleus = _gaps(logits, tokens, seed, positions, params, 0.0)
    return torch.where(in_nucleus, gap, torch.full_like(gap, math.inf))


def check_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    logprobs: torch.Tensor | Sequence[float],
    params: SamplingParams,
    atol: float,
) -> SamplingCheck:
    """Recorded log-probs (N,) must equal log_softmax(logits / T)[token] within atol; NaN never passes.

    The trainer's importance ratio uses these numbers, so a worker must not be able to bend them.
    `first_bad_position` is the row index into `logits` (the output position when rows start at 0).
    """
    n = _check_rows("check_logprobs", logits, tokens)
    claimed = torch.as_tensor(logprobs, dtype=torch.float64).to(logits.device).reshape(-1)
    if claimed.shape != (n,):
        raise InferenceError(f"check_logprobs: {n} tokens but {claimed.shape[0]} log-probs")
    if n == 0:
        return SamplingCheck(ok=True, first_bad_position=None, detail="no tokens")
    tokens = tokens.to(device=logits.device, dtype=torch.int64)
    if (outside := _out_of_vocab(tokens, logits.shape[-1])) is not None:
        return outside
    index = tokens.unsqueeze(-1)
    expected = torch.log_softmax(_scaled(logits, params.temperature), dim=-1).gather(-1, index).squeeze(-1).double()
    error = (claimed - expected).abs()
    bad = ~(error <= atol)  # NaN compares false, so it is bad
    if not bool(bad.any()):
        return SamplingCheck(ok=True, first_bad_position=None, detail=f"{n} log-probs match within {atol}")
    i = int(torch.nonzero(bad)[0, 0])
    return SamplingCheck(
        ok=False,
        first_bad_position=i,
        detail=f"output position {i}: log-prob {float(claimed[i]):.6g} recorded, {float(expected[i]):.6g} "
        f"recomputed at temperature {params.temperature} (atol {atol})",
    )


def _check_rows(caller: str, logits: torch.Tensor, tokens: torch.Tensor) -> int:
    """Shape and range checks shared by the validators' entry points; returns N."""
    if logits.dim() != 2:
        raise InferenceError(f"{caller}: logits must be (N, V), got shape {tuple(logits.shape)}")
    n = logits.shape[0]
    if tokens.shape != (n,):
        raise InferenceError(f"{caller}: tokens must have shape ({n},), got {tuple(tokens.shape)}")
    return n


def _out_of_vocab(tokens: torch.Tensor, vocab: int, positions: torch.Tensor | None = None) -> SamplingCheck | None:
    """A failed check naming the first token id outside [0, vocab), or None when all are inside."""
    bad = (tokens < 0) | (tokens >= vocab)
    if not bool(bad.any()):
        return None
    i = int(torch.nonzero(bad)[0, 0])
    position = int(positions[i]) if positions is not None else i
    return SamplingCheck(
        ok=False,
        first_bad_position=position,
        detail=f"output position {position}: token {int(tokens[i])} is outside the vocabulary [0, {vocab})",
    )
