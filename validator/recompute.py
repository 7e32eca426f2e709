"""The last and costliest check: recompute every completion with the checkpoint and compare.

One prefill of prompt + completion per row (`node.model.forward.forward_hidden`) gives the hidden states the
TOPLOC proofs commit to and the logits the seeded sampler chose from; a row passes when its proof verifies
within the thresholds and every sampled token and log-prob is the one those logits give.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ledger.types import Reason
from node.inference.sampler import SamplingParams, check_logprobs, check_sampled
from node.model.forward import forward_hidden
from node.model.loading import LoadedModel
from node.proofs import ChunkResult, ProofCheck, ProofThresholds, verify_proof
from node.rollouts import RolloutMeta, RolloutRow
from validator.checks import MODEL
from validator.config import ValidatorConfig
from validator.verdict import Verdict, reject

_PAD_ID = 0  # any id works: the attention mask hides padding and no output is read at a padded position


def check_model_hash(claimed: bytes, checkpoint_hash: bytes) -> Verdict | None:
    """The file must claim the weights the validator proves against (a cheap test before any prefill)."""
    if claimed == checkpoint_hash:
        return None
    return reject(
        Reason.PROOF_INVALID,
        MODEL,
        "the file was generated with other weights than the checkpoint's",
        claimed="0x" + claimed.hex(),
        checkpoint="0x" + checkpoint_hash.hex(),
    )


def prefill_outputs(
    model: PreTrainedModel, rows: Sequence[RolloutRow], batch_size: int
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(row index, hidden (n_out, H), logits (n_out, V)) at the positions that sampled each output token.

    One prefill of prompt + completion minus its last token: its last n_out positions are len(prompt) - 1 ..
    len(prompt) + n_out - 2. Rows are left-padded in batches, with explicit position ids that start every row
    at 0, as the worker's `TorchBackend` does, so batching changes the numbers by float rounding only.
    """
    device = model.device
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        sequences = [row.input_tokens + row.output_tokens[:-1] for row in batch]
        width = max(len(s) for s in sequences)
        input_ids = torch.full((len(batch), width), _PAD_ID, dtype=torch.int64)  # (B, T), left-padded
        mask = torch.zeros((len(batch), width), dtype=torch.int64)  # (B, T), 1 on real tokens
        for i, sequence in enumerate(sequences):
            input_ids[i, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.int64)
            mask[i, width - len(sequence) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        longest = max(len(row.output_tokens) for row in batch)
        out = forward_hidden(
            model,
            input_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            logits_last=longest,  # (B, longest, V): the head only where outputs were sampled
        )
        for i, row in enumerate(batch):
            n_out = len(row.output_tokens)
            yield start + i, out.hidden[i, width - n_out :], out.logits[i, longest - n_out :]  # (n, H), (n, V)


@dataclass(frozen=True)
class ProofHeadroom:
    """The largest of each TOPLOC statistic over every chunk of an accepted file: how close honest work came to
    the thresholds (a daemon logs it; calibration reads it)."""

    exp_mismatches: int = 0
    mant_err_mean: float = 0.0
    mant_err_median: float = 0.0

    def including(self, chunks: Iterable[ChunkResult]) -> ProofHeadroom:
        worst = self
        for c in chunks:
            worst = ProofHeadroom(
                max(worst.exp_mismatches, c.exp_mismatches),
                max(worst.mant_err_mean, c.mant_err_mean),
                max(worst.mant_err_median, c.mant_err_median),
            )
        return worst


def check_row_recomputed(
    index: int,
    row: RolloutRow,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    params: SamplingParams,
    config: ValidatorConfig,
) -> Verdict | ProofCheck:
    """The row's proof against the recomputed hidden states (7), then its tokens and log-probs against the
    recomputed logits under the claimed sampling (5); the passing proof check when all hold.
    hidden (n_out, H), logits (n_out, V)."""
    proof = verify_proof(hidden, row.proofs, config.thresholds)
    if not proof.ok:
        return _proof_rejected(index, proof, config.thresholds)
    tokens = torch.tensor(row.output_tokens, dtype=torch.int64, device=logits.device)  # (n_out,)
    positions = torch.arange(len(row.output_tokens), dtype=torch.int64, device=logits.device)  # (n_out,)
    sampled = check_sampled(logits, tokens, row.seed, positions, params, config.sampling_margin)
    if sampled.ok:
        sampled = check_logprobs(logits, tokens, row.output_logprobs, params, config.logprob_atol)
    if sampled.ok:
        return proof
    return reject(
        Reason.INVALID_SAMPLING, MODEL, f"row {index}: {sampled.detail}", row=index, position=sampled.first_bad_position
    )


def _proof_rejected(index: int, proof: ProofCheck, thresholds: ProofThresholds) -> Verdict:
    chunk = proof.first_bad_chunk or 0
    if proof.malformed is not None:
        return reject(Reason.PROOF_INVALID, MODEL, f"row {index}: {proof.malformed}", row=index, chunk=chunk)
    result = proof.chunks[chunk]
    return reject(
        Reason.PROOF_INVALID,
        MODEL,
        f"row {index}: TOPLOC chunk {chunk} does not match the checkpoint's hidden states",
        row=index,
        chunk=chunk,
        exp_mismatches=result.exp_mismatches,
        mant_err_mean=result.mant_err_mean,
        mant_err_median=result.mant_err_median,
        thresholds={
            "max_exp_mismatches": thresholds.max_exp_mismatches,
            "max_mant_err_mean": thresholds.max_mant_err_mean,
            "max_mant_err_median": thresholds.max_mant_err_median,
        },
    )


def check_model(
    rows: Sequence[RolloutRow], meta: RolloutMeta, checkpoint: LoadedModel, config: ValidatorConfig
) -> Verdict | ProofHeadroom:
    """The claimed weights are the checkpoint's, then every row recomputed with it holds; the first failure decides."""
    if verdict := check_model_hash(meta.model_hash, checkpoint.model_hash):
        return verdict
    sampling = meta.sampling
    params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens)
    headroom = ProofHeadroom()
    for index, hidden, logits in prefill_outputs(checkpoint.model, rows, config.prefill_batch_size):
        result = check_row_recomputed(index, rows[index], hidden, logits, params, config)
        if isinstance(result, Verdict):
            return result
        headroom = headroom.including(result.chunks)
    return headroom
