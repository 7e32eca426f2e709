"""Batched generation with plain torch and a KV cache: the CPU backend, and the reference the vLLM one must match.

Proofs must not depend on batch composition, so each row computes what it would compute alone: prompts
are left-padded, the attention mask hides the padding, and explicit position ids start every row at 0.
A validator's single prefill of prompt + completion then sees the same hidden states (to float rounding).
Requests with the same prompt (a group) share one prefill: its keys and values are copied to each of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from engine.inference.base import Completion, FinishReason, GenerationRequest
from engine.inference.errors import InferenceError
from engine.inference.sampler import SamplingParams, sample_tokens, seed_to_int64
from engine.model.forward import forward_hidden
from engine.model.loading import model_positions

if TYPE_CHECKING:
    from engine.model.loading import LoadedModel


class TorchBackend:
    """`InferenceBackend` over any Hugging Face causal LM that `forward_hidden` runs."""

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: Sequence[int],
        *,
        pad_token_id: int,
        max_batch_size: int = 16,
        device: str | torch.device | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """`vocab_size` is N, the ids sampled: the first N columns of the logits (the tokenizer's ids,
        `LoadedModel.sampled_vocab_size`); None: every row of the LM head."""
        if not eos_token_ids:
            raise InferenceError("TorchBackend needs at least one EOS token id to know when a completion ends")
        if max_batch_size < 1:
            raise InferenceError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        torch.nn.Module.to(model, self.device)  # in place; PreTrainedModel.to's stub hides that it takes a device
        self.model = model.eval()
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        rows = int(torch.nn.Module.get_parameter(model.get_input_embeddings(), "weight").shape[0])
        if vocab_size is not None and not 1 <= vocab_size <= rows:
            raise InferenceError(f"vocab_size must be in [1, {rows}] (the embedding's rows), got {vocab_size}")
        self.vocab_size = rows if vocab_size is None else vocab_size  # N: logits[:, :N] are sampled
        self.max_positions = model_positions(model)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, *, max_batch_size: int = 16) -> TorchBackend:
        """A backend for a model `engine.model.loading.load_model` returned; pads with the tokenizer's pad id and
        samples the tokenizer's ids only."""
        pad = loaded.tokenizer.pad_token_id
        return cls(
            loaded.model,
            loaded.eos_token_ids,
            pad_token_id=int(pad) if pad is not None else loaded.eos_token_ids[0],
            max_batch_size=max_batch_size,
            vocab_size=loaded.sampled_vocab_size,
        )

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        params: SamplingParams,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[Completion]:
        """Completes the requests in chunks of max_batch_size; `progress(n)` as n completions finish."""
        for index, request in enumerate(requests):
            self._check_request(index, request, params)
        completions: list[Completion] = []
        for start in range(0, len(requests), self.max_batch_size):
            chunk = requests[start : start + self.max_batch_size]
            completions.extend(self._generate_chunk(chunk, params, progress))
        return completions

    def _check_request(self, index: int, request: GenerationRequest, params: SamplingParams) -> None:
        prompt = request.prompt_tokens
        if not prompt:
            raise InferenceError(f"request {index}: the prompt is empty; it needs at least one token")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise InferenceError(f"request {index}: prompt token ids must be in [0, {self.vocab_size})")
        if self.max_positions and len(prompt) + params.max_tokens > self.max_positions:
            raise InferenceError(
                f"request {index}: prompt of {len(prompt)} tokens + max_tokens {params.max_tokens} exceeds the "
                f"model's {self.max_positions} positions; shorten the prompt or lower max_tokens"
            )

    def _generate_chunk(
        self,
        requests: Sequence[GenerationRequest],
        params: SamplingParams,
        progress: Callable[[int], None] | None,
    ) -> list[Completion]:
        batch = len(requests)
        # a group's requests share their prompt: prefill each distinct prompt once, then copy its keys and values
        distinct: dict[tuple[int, ...], int] = {}  # prompt -> its prefill row
        owner = [distinct.setdefault(tuple(r.prompt_tokens), len(distinct)) for r in requests]
        prompts = list(distinct)
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.int64)  # (U, T0), left-padded
        mask = torch.zeros((len(prompts), width), dtype=torch.int64)  # (U, T0), 1 on real tokens
        for row, prompt in enumerate(prompts):
            input_ids[row, width - lengths[row] :] = torch.tensor(prompt, dtype=torch.int64)
            mask[row, width - lengths[row] :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (U, T0): each row's real tokens at 0, 1, ...
        input_ids, mask, positions = (t.to(self.device) for t in (input_ids, mask, positions))
        seeds = torch.tensor([seed_to_int64(r.seed) for r in requests], dtype=torch.int64, device=self.device)
        next_position = torch.tensor(lengths, dtype=torch.int64, device=self.device).unsqueeze(-1)  # (U, 1)

        out = forward_hidden(
            self.model, input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_last=1
        )
        cache = out.past_key_values
        logits, hidden = out.logits[:, -1], out.hidden[:, -1]  # (U, V), (U, H): they sample output token 0
        if len(prompts) < batch:  # one row per request from here on
            expand = torch.tensor(owner, dtype=torch.int64, device=self.device)
            cache.batch_select_indices(expand)
            logits, hidden, mask, next_position = (t[expand] for t in (logits, hidden, mask, next_position))
        rows = list(range(batch))  # batch index -> request index of the rows still generating
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        hiddens: list[list[torch.Tensor]] = [[] for _ in requests]  # (H,) views of each step's hidden
        finish: list[FinishReason | None] = [None] * batch
        for step in range(params.max_tokens):
            step_positions = torch.full((len(rows),), step, dtype=torch.int64, device=self.device)
            # the first N columns only: a padded LM-head row is no token, and its logit must never win
            sampled, sampled_logprobs = sample_tokens(logits[:, : self.vocab_size], seeds, step_positions, params)
            keep: list[int] = []
            for i, (token, logprob) in enumerate(zip(sampled.tolist(), sampled_logprobs.tolist(), strict=True)):
                row = rows[i]
                tokens[row].append(token)
                logprobs[row].append(logprob)
                hiddens[row].append(hidden[i])
                if token in self.eos_token_ids:
                    finish[row] = "stop"
                elif step + 1 == params.max_tokens:
                    finish[row] = "length"
                else:
                    keep.append(i)
            if progress is not None and len(keep) < len(rows):
                progress(len(rows) - len(keep))
            if not keep:
                break
            if len(keep) < len(rows):  # drop finished rows so they stop costing compute
                index = torch.tensor(keep, dtype=torch.int64, device=self.device)
                cache.batch_select_indices(index)
                rows = [rows[i] for i in keep]
                sampled, seeds, mask, next_position = (t[index] for t in (sampled, seeds, mask, next_position))
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)  # (b, T + 1)
            out = forward_hidden(
                self.model,
                sampled.unsqueeze(-1),  # (b, 1)
                attention_mask=mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits, hidden = out.logits[:, -1], out.hidden[:, -1]
            next_position = next_position + 1

        return [
            Completion(
                prompt_tokens=list(request.prompt_tokens),
                output_tokens=tokens[row],
                logprobs=logprobs[row],
                finish_reason=_finished(finish[row]),
                hidden=torch.stack(hiddens[row]).float().cpu(),  # (n_out, H)
            )
            for row, request in enumerate(requests)
        ]


def _finished(reason: FinishReason | None) -> FinishReason:
    """Every row ends by the last step (the loop marks "length" there); None would be a bug in the loop."""
    if reason is None:
        raise InferenceError("generation ended with an unfinished row")
    return reason
