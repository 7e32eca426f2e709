"""The first route prefills each distinct prompt once and continues every completion of it from a copy of its keys
and values: the same hidden states and logits as a row alone, to float rounding, for fewer tokens."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest
import torch

from engine.generate import Generated
from engine.model.loading import LoadedModel
from protocol.rollouts import RolloutRow
from validator.recompute import prefill_alone, prefill_outputs


@pytest.fixture(scope="module")
def rows(generate: Callable[..., Generated]) -> list[RolloutRow]:
    """Three groups of four, shuffled so groups interleave, and one completion cut to a single token."""
    generated = generate(counter=7, prompts=3, group=4)
    rows = list(generated.rows)
    rows[5] = dataclasses.replace(rows[5], output_tokens=rows[5].output_tokens[:1])
    random.Random(0).shuffle(rows)
    return rows


@pytest.mark.parametrize("batch_size", [1, 3, 5, 16])
def test_every_row_gets_what_it_gets_alone(rows: list[RolloutRow], checkpoint: LoadedModel, batch_size: int) -> None:
    seen = []
    for index, hidden, logits in prefill_outputs(checkpoint.model, rows, batch_size):
        seen.append(index)
        alone_hidden, alone_logits = prefill_alone(checkpoint.model, rows[index])
        n_out = len(rows[index].output_tokens)
        assert hidden.shape == alone_hidden.shape and hidden.shape[0] == n_out
        assert logits.shape == alone_logits.shape and logits.shape[0] == n_out
        torch.testing.assert_close(hidden, alone_hidden, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(logits, alone_logits, atol=2e-5, rtol=1e-4)
    assert sorted(seen) == list(range(len(rows)))


def test_a_group_prefills_its_prompt_once(rows: list[RolloutRow], checkpoint: LoadedModel) -> None:
    fed: list[int] = []
    embeddings = checkpoint.model.get_input_embeddings()
    hook = embeddings.register_forward_hook(lambda _module, args, _out: fed.append(int(args[0].numel())))
    try:
        list(prefill_outputs(checkpoint.model, rows, 16))
    finally:
        hook.remove()
    prompts = {tuple(r.input_tokens) for r in rows}
    longest_prompt = max(len(p) for p in prompts)
    longest_completion = max(len(r.output_tokens) for r in rows) - 1
    # one forward of the three prompts (left-padded), one of the twelve completions (right-padded)
    assert fed == [len(prompts) * longest_prompt, len(rows) * longest_completion]
    unshared = sum(len(r.input_tokens) + len(r.output_tokens) - 1 for r in rows)
    assert sum(fed) < unshared, (fed, unshared)
