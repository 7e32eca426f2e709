"""One forward pass that returns the logits and the last hidden states (the LM head's input)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (B, T, V) float32
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
) -> ForwardOutput:
    """Runs the decoder body, then the LM head on its output, so the proof and the sampler see one tensor.

    Works for any `*ForCausalLM` whose body is `model.model` and head `model.lm_head` (Qwen2, Llama, ...).
    """
    body = model.get_decoder()
    cache = {} if past_key_values is None else {"past_key_values": past_key_values}  # None is deprecated there
    out = body(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache, **cache
    )
    hidden = out.last_hidden_state  # (B, T, H)
    logits = model.get_output_embeddings()(hidden).float()  # (B, T, V)
    return ForwardOutput(logits=logits, hidden=hidden, past_key_values=out.past_key_values if use_cache else None)
