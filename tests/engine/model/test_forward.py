"""forward_hidden: the LM head's input and output, at every position or only at the last K."""

from __future__ import annotations

import torch

from engine.model.forward import forward_hidden
from engine.model.tiny import build_model


def test_logits_last_gives_the_tail_of_the_full_logits() -> None:
    model = build_model(seed=0)
    ids = torch.randint(0, 200, (2, 12))
    full = forward_hidden(model, ids)
    tail = forward_hidden(model, ids, logits_last=3)
    assert tail.logits.shape == (2, 3, full.logits.shape[-1])
    assert torch.allclose(tail.logits, full.logits[:, -3:], atol=1e-5)  # same math, other BLAS blocking
    assert torch.equal(tail.hidden, full.hidden)  # hidden states stay complete: proofs need every position


def test_logits_are_the_head_applied_to_the_hidden_states() -> None:
    model = build_model(seed=0)
    ids = torch.randint(0, 200, (1, 8))
    out = forward_hidden(model, ids)
    with torch.inference_mode():
        assert torch.allclose(out.logits, model(ids).logits.float(), atol=1e-5)
        assert torch.allclose(out.logits, model.get_output_embeddings()(out.hidden).float())
