"""The last and costliest check: recompute every completion with the checkpoint and compare.

One prefill of prompt + completion per row (`engine.model.forward.forward_hidden`) gives the hidden states the
TOPLOC proofs commit to and the logits the seeded sampler chose from; a row passes when its proof verifies
within the thresholds and every sampled token and log-prob is the one those logits give.

A slash takes an honest worker's money if the validator is wrong, so a row that fails is checked a second time by
an independent route before anything is decided: the row alone, with the checkpoint in float64 (no batch
neighbours, no float32 reduction order). A file is rejected as slashable only when a row fails on both routes and,
on the second, lies clearly past a threshold (`clear_factor` times it). Otherwise the verdict is borderline: the
file is refused (never trained on, and never paid: the daemon sends `refuseLeaf`) but not slashed, and the daemon
logs it and shows it on the dashboard.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from engine.inference.sampler import SamplingParams, check_logprobs, check_sampled, claimed_gaps
from engine.model.forward import forward_hidden
from engine.model.loading import LoadedModel
from engine.proofs import ChunkResult, ProofCheck, ProofThresholds, verify_proof
from ledger.types import Reason
from protocol.rollouts import RolloutMeta, RolloutRow
from validator.checks import MODEL
from validator.config import ValidatorConfig
from validator.verdict import Verdict, borderline, reject

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

    The first route, as the worker generated: each distinct prompt of a batch is prefilled once, its keys and
    values are copied to every row of that prompt, and one forward over each row's completion (but its last
    token) continues from them. The prompt's last position sampled output token 0, completion position j token
    j + 1. A group of G completions of one prompt costs one prompt instead of G, the most of a row's tokens
    where completions are short. Rows are batched in order of their prompt's first row (a file's groups are
    contiguous), `batch_size` rows a forward; prompts are left-padded and completions right-padded, with explicit
    position ids that start every prompt at 0, as the worker's `TorchBackend` does, so batching and sharing change
    the numbers by float rounding only. Rows come out in that order, each with its index in `rows`.
    """
    device = model.device
    first: dict[tuple[int, ...], int] = {}  # prompt -> the index of its first row
    order = sorted(range(len(rows)), key=lambda i: (first.setdefault(tuple(rows[i].input_tokens), i), i))
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        distinct: dict[tuple[int, ...], int] = {}  # prompt -> its prefill row
        owner = [distinct.setdefault(tuple(rows[i].input_tokens), len(distinct)) for i in batch]
        prompts = list(distinct)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), _PAD_ID, dtype=torch.int64)  # (U, T0), left-padded
        mask = torch.zeros((len(prompts), width), dtype=torch.int64)  # (U, T0), 1 on real tokens
        for u, prompt in enumerate(prompts):
            input_ids[u, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.int64)
            mask[u, width - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (U, T0)
        out = forward_hidden(
            model,
            input_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            use_cache=True,
            logits_last=1,
        )
        expand = torch.tensor(owner, dtype=torch.int64)  # (B,): each row's prefill row
        on_device = expand.to(device)
        first_hidden, first_logits = out.hidden[on_device, -1:], out.logits[on_device, -1:]  # (B, 1, H), (B, 1, V)
        longest = max(len(rows[i].output_tokens) for i in batch) - 1  # completion tokens fed, the last left out
        if longest == 0:  # every completion is one token: the prompts sampled all of them
            for b, i in enumerate(batch):
                yield i, first_hidden[b], first_logits[b]
            continue
        cache = out.past_key_values
        cache.batch_select_indices(on_device)  # one copy of its prompt's keys and values per row
        fed = torch.full((len(batch), longest), _PAD_ID, dtype=torch.int64)  # (B, L), right-padded
        fed_mask = torch.zeros((len(batch), longest), dtype=torch.int64)  # (B, L)
        fed_positions = torch.zeros((len(batch), longest), dtype=torch.int64)  # (B, L)
        for b, i in enumerate(batch):
            tokens = rows[i].output_tokens[:-1]
            fed[b, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            fed_mask[b, : len(tokens)] = 1
            prompt_length = len(rows[i].input_tokens)
            fed_positions[b] = torch.arange(prompt_length, prompt_length + longest)
        rest = forward_hidden(
            model,
            fed.to(device),
            attention_mask=torch.cat([mask[expand], fed_mask], dim=-1).to(device),  # (B, T0 + L)
            position_ids=fed_positions.to(device),
            past_key_values=cache,
        )
        for b, i in enumerate(batch):
            n = len(rows[i].output_tokens) - 1
            hidden = torch.cat([first_hidden[b], rest.hidden[b, :n]])  # (n_out, H)
            logits = torch.cat([first_logits[b], rest.logits[b, :n]])  # (n_out, V)
            yield i, hidden, logits


def prefill_alone(model: PreTrainedModel, row: RolloutRow) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden (n_out, H), logits (n_out, V)) of one row by another way than the first route: one forward of its
    prompt + completion but the last token, no cache, no neighbours; its last n_out positions sampled the
    outputs."""
    sequence = torch.tensor([row.input_tokens + row.output_tokens[:-1]], dtype=torch.int64)  # (1, T)
    n_out = len(row.output_tokens)
    out = forward_hidden(model, sequence.to(model.device), logits_last=n_out)  # (1, n_out, V)
    return out.hidden[0, -n_out:], out.logits[0]


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
    *,
    vocab: int,
) -> Verdict | ProofCheck:
    """The row's proof against the recomputed hidden states (7), then its tokens and log-probs against the
    recomputed logits under the claimed sampling (5); the passing proof check when all hold.
    hidden (n_out, H), logits (n_out, V); `vocab` is N, the ids the worker sampled from (the checkpoint's
    `sampled_vocab_size`): only the first N logits are read, so log-probs are over the worker's distribution."""
    proof = verify_proof(hidden, row.proofs, config.thresholds)
    if not proof.ok:
        return _proof_rejected(index, proof, config.thresholds)
    logits = logits[:, :vocab]  # (n_out, N): the LM head's padded rows are no tokens
    tokens = torch.tensor(row.output_tokens, dtype=torch.int64, device=logits.device)  # (n_out,)
    positions = torch.arange(len(row.output_tokens), dtype=torch.int64, device=logits.device)  # (n_out,)
    sampled = check_sampled(logits, tokens, row.seed, positions, params, config.sampling_margin)
    measured: dict[str, float | bool] = {}
    at = sampled.first_bad_position
    if not sampled.ok and at is not None and 0 <= row.output_tokens[at] < logits.shape[-1]:  # else: outside, clear
        gap = claimed_gaps(logits[at : at + 1], tokens[at : at + 1], row.seed, positions[at : at + 1], params)
        if math.isfinite(float(gap[0])):
            measured["gap"] = float(gap[0])
        else:  # outside the nucleus: always clear (and JSON has no infinity)
            measured["outside_nucleus"] = True
    if sampled.ok:
        sampled = check_logprobs(logits, tokens, row.output_logprobs, params, config.logprob_atol)
        if not sampled.ok and (at := sampled.first_bad_position) is not None:
            scaled = logits[at].float() / params.temperature if params.temperature > 0 else logits[at].float()
            recomputed = float(torch.log_softmax(scaled, dim=-1)[int(tokens[at])])
            measured["logprob_error"] = abs(float(row.output_logprobs[at]) - recomputed)
    if sampled.ok:
        return proof
    return reject(
        Reason.INVALID_SAMPLING,
        MODEL,
        f"row {index}: {sampled.detail}",
        row=index,
        position=sampled.first_bad_position,
        **measured,
    )


def _chunk_stats(proof: ProofCheck) -> list[dict[str, float]]:
    """Each chunk's statistics (what `ChunkResult` holds but its verdict), for the evidence of a rejection."""
    return [{k: v for k, v in dataclasses.asdict(c).items() if k != "ok"} for c in proof.chunks]


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
        chunks=_chunk_stats(proof),  # every chunk of the row, against the thresholds below
        thresholds=dataclasses.asdict(thresholds),
    )


def is_clear(failure: Verdict, config: ValidatorConfig) -> bool:
    """Whether a row's rejection lies clearly past its threshold (`clear_factor` times it), not near it.

    Bytes that are not a proof at all are clear; so is a token outside the nucleus."""
    e, factor = failure.evidence, config.clear_factor
    if failure.reason == Reason.PROOF_INVALID:
        if "exp_mismatches" not in e:  # malformed proof bytes
            return True
        t = config.thresholds
        return (
            e["exp_mismatches"] > factor * t.max_exp_mismatches
            or e["mant_err_mean"] > factor * t.max_mant_err_mean
            or e["mant_err_median"] > factor * max(t.max_mant_err_median, 1.0)
        )
    if e.get("outside_nucleus"):
        return True
    if "gap" in e:
        return bool(e["gap"] > factor * max(config.sampling_margin, 1e-6))
    if "logprob_error" in e:
        return bool(e["logprob_error"] > factor * config.logprob_atol)
    return True


def _alone_in_float64(model: PreTrainedModel) -> PreTrainedModel:
    """The second route's model: a float64 copy (the checkpoint itself is left as it is)."""
    copied = copy.deepcopy(model)
    torch.nn.Module.to(copied, torch.float64)  # in place; PreTrainedModel.to's stub does not take a dtype
    return copied


def second_route(
    index: int,
    row: RolloutRow,
    model64: PreTrainedModel,
    params: SamplingParams,
    config: ValidatorConfig,
    *,
    vocab: int,
) -> Verdict | ProofCheck:
    """The row recomputed alone (batch of one, prompt and completion in one forward) in float64, judged by the
    same thresholds over the same `vocab` ids."""
    hidden, logits = prefill_alone(model64, row)
    return check_row_recomputed(index, row, hidden, logits, params, config, vocab=vocab)


def check_model(
    rows: Sequence[RolloutRow], meta: RolloutMeta, checkpoint: LoadedModel, config: ValidatorConfig
) -> Verdict | ProofHeadroom:
    """The claimed weights are the checkpoint's, then every row recomputed with it holds.

    Every row is recomputed; failing rows go to the second route (at most `max_rechecked_rows` of them), and the
    first row confirmed there clearly decides a slashable rejection. Failures that none confirm clearly give a
    borderline verdict (`Outcome.BORDERLINE`), which the daemon refuses on chain without a slash (`refuseLeaf`).
    """
    if verdict := check_model_hash(meta.model_hash, checkpoint.model_hash):
        return verdict
    sampling = meta.sampling
    params = SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens)
    vocab = checkpoint.sampled_vocab_size  # the ids every worker samples from
    headroom = ProofHeadroom()
    failures: list[Verdict] = []
    for index, hidden, logits in prefill_outputs(checkpoint.model, rows, config.prefill_batch_size):
        result = check_row_recomputed(index, rows[index], hidden, logits, params, config, vocab=vocab)
        if isinstance(result, Verdict):
            failures.append(result)
        else:
            headroom = headroom.including(result.chunks)
    if not failures:
        return headroom
    failures.sort(key=lambda f: int(f.evidence["row"]))  # the rows in file order, as they were batched or not
    return _judge_failures(rows, checkpoint, config, params, failures)


def _judge_failures(
    rows: Sequence[RolloutRow],
    checkpoint: LoadedModel,
    config: ValidatorConfig,
    params: SamplingParams,
    failures: list[Verdict],
) -> Verdict:
    model64 = _alone_in_float64(checkpoint.model)
    rechecked: list[dict[str, Any]] = []
    where = {"step": rows[0].step, "model_hash": "0x" + checkpoint.model_hash.hex(), "failing_rows": len(failures)}
    for first in failures[: config.max_rechecked_rows]:
        index = int(first.evidence["row"])
        second = second_route(index, rows[index], model64, params, config, vocab=checkpoint.sampled_vocab_size)
        confirmed = isinstance(second, Verdict)
        clear = isinstance(second, Verdict) and is_clear(second, config)
        if isinstance(second, Verdict):
            second_record = second.to_dict() | {"route": "alone, float64"}
        else:
            second_record = {"accepted": True, "route": "alone, float64", "chunks": _chunk_stats(second)}
        first_record = first.to_dict() | {"route": f"shared prompts, batches of {config.prefill_batch_size}, float32"}
        rechecked.append(
            {"row": index, "first": first_record, "second": second_record, "confirmed": confirmed, "clear": clear}
        )
        if clear:
            assert isinstance(second, Verdict) and second.reason is not None
            return reject(
                second.reason,
                MODEL,
                f"{first.detail}; confirmed alone in float64",
                **first.evidence,
                **where,
                rechecked=rechecked,
            )
    reason = failures[0].reason
    assert reason is not None
    return borderline(
        reason,
        MODEL,
        f"borderline: {failures[0].detail}; not clearly confirmed alone in float64, so refused but not slashed",
        **failures[0].evidence,
        **where,
        rechecked=rechecked,
    )
