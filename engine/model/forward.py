"""One forward pass that returns the logits and the last hidden states (the LM head's input)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (B, T, V) float32, or (B, K, V) for the last K positions when `logits_last=K`
    hidden: torch.Tensor  # (B, T, H): final-norm hidden states, what the LM head multiplies
    past_key_values: Any  # the KV cache to continue from, or None


@torch.inference_mode()
def forward_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values: Any = None,
    use_cache: bool = False,
    logits_last: int | None = None,
) -> ForwardOutput:
    """Runs the decoder body, then the LM head on its output, so the proof and the sampler see one tensor.

    Works for any `*ForCausalLM` whose body is `model.model` and head `model.lm_head` (Qwen2, Llama, ...).
    `logits_last=K` applies the head to the last K positions only: a prompt prefill needs one, a validator's
    prefill the completion's; with a 152k vocabulary, logits at every position would cost gigabytes.
    """
    body = model.get_decoder()
    cache = {} if past_key_values is None else {"past_key_values": past_key_values}  # None is deprecated there
    out = body(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache, **cache
    )
    hidden = out.last_hidden_state  # (B, T, H)
    head_input = hidden if logits_last is None else hidden[:, -logits_last:]  # (B, T or K, H)
    logits = model.get_output_embeddings()(head_input).float()  # (B, T or K, V)
    return ForwardOutput(logits=logits, hidden=hidden, past_key_values=out.past_key_values if use_cache else None)
