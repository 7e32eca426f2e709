"""A tiny model whose LM head is padded past its tokenizer's ids, as a real Qwen's is (151,665 ids, 151,936 rows),
with padded rows that would win nearly every draw if a sampler let them: the worst case for an id no text has."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from engine.model.shapes import TINY
from engine.model.tiny import build_model, save_model_dir
from engine.model.tokenizer import build_tokenizer

PADDING = 37  # rows past the tokenizer's ids
SCALE = 100.0  # how far a padded row's logit outgrows the real ones


def padded_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """The tiny model with PADDING more embedding rows, written to `out_dir`. The embedding is tied to the LM head,
    so a row's logit is h . w: the padded rows are +-SCALE times real rows in pairs, and the larger of each pair,
    SCALE |h . w|, outgrows every real logit at almost every position."""
    tokenizer = build_tokenizer()
    ids = len(tokenizer)
    model = build_model(dataclasses.replace(TINY, name="tiny-padded", embedding_rows=ids + PADDING), seed=seed)
    weight = model.get_input_embeddings().weight  # (ids + PADDING, H), the LM head's too
    with torch.no_grad():
        for j in range(PADDING):
            real = (j // 2) * 7 % ids
            weight[ids + j] = (SCALE if j % 2 == 0 else -SCALE) * weight[real]
    return save_model_dir(model, tokenizer, out_dir)
