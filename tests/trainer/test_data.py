"""Rollout files to micro-batches: the async window, the online filter, padding, and the trainer's log-probs."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from engine.inference.base import GenerationRequest
from engine.inference.sampler import SamplingParams
from engine.inference.torch_backend import TorchBackend
from engine.model.tiny import build_model
from protocol.rollouts import RolloutFile, RolloutMeta, RolloutRow, SamplingMeta, read_rollouts, write_rollouts
from trainer.data import (
    DuplicateRolloutError,
    PromptUnit,
    Sample,
    build_samples,
    collate,
    collate_units,
    prompt_units,
    recompute_logprobs,
    rewards_all_equal,
    shared_logprobs,
)
from trainer.errors import TrainerError

NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"
PAD = 0


def make_meta(temperature: float = 1.0) -> RolloutMeta:
    return RolloutMeta(
        pool_id=7,
        node=NODE,
        manifest_hash=b"\x01" * 32,
        sampling=SamplingMeta(temperature=temperature, top_p=1.0, max_tokens=16),
        task_spec_hash=b"\x02" * 32,
        model_hash=b"\x03" * 32,
        counter=0,
        created_by="prime-node test",
    )


def make_row(
    group: int, reward: float, *, step: int = 5, prompt: Sequence[int] = (1, 2, 3), **changes: Any
) -> RolloutRow:
    output = changes.pop("output_tokens", [4, 5])
    fields: dict[str, Any] = {
        "problem_id": f"p/{group}",
        "group": group,
        "input_tokens": list(prompt),
        "output_tokens": output,
        "output_logprobs": changes.pop("output_logprobs", [-1.0] * len(output)),
        "finish_reason": "stop",
        "reward": reward,
        "task_reward": reward,
        "length_penalty": 0.0,
        "target_length": -1,
        "seed": group,
        "step": step,
        "proofs": b"\x00",  # the format only asks for non-empty proofs; nothing here checks them
    }
    return RolloutRow(**(fields | changes))


def write(path: Path, rows: list[RolloutRow], temperature: float = 1.0) -> Path:
    write_rollouts(path, make_meta(temperature), rows)
    return path


def read(path: Path) -> RolloutFile:
    return read_rollouts(path, max_bytes=1 << 26)


def centred(rewards: Sequence[float]) -> list[float]:
    """A simple stand-in for the GRPO advantage: reward minus the group mean."""
    mean = statistics.fmean(rewards)
    return [r - mean for r in rewards]


def sample(prompt: list[int], output: list[int], advantage: float = 1.0, old: list[float] | None = None) -> Sample:
    return Sample(prompt, output, old, advantage, reward=0.0, group_key="00:0", step=0, work_key=b"\x00")


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return build_model(seed=0)


# --- samples and the online filter ---------------------------------------------------------------------------


def test_groups_whose_rewards_are_all_equal_are_dropped(tmp_path: Path) -> None:
    rows = [make_row(0, 1.0), make_row(0, 0.0), make_row(1, 1.0), make_row(1, 1.0), make_row(2, 0.5)]
    file = read(write(tmp_path / "r.parquet", rows))
    built = build_samples([file], centred)
    assert (built.groups_kept, built.groups_dropped) == (1, 2)  # group 1 all 1.0, group 2 a single row
    assert [(s.reward, s.advantage) for s in built.samples] == [(1.0, 0.5), (0.0, -0.5)]
    assert {s.group_key for s in built.samples} == {file.work_key.hex() + ":0"}
    assert all(s.work_key == file.work_key and s.step == 5 and s.old_logprobs is None for s in built.samples)


def test_groups_of_two_files_stay_apart_and_keep_file_then_row_order(tmp_path: Path) -> None:
    first = write(tmp_path / "a.parquet", [make_row(0, 1.0), make_row(0, 0.0, prompt=[9])])
    second = write(tmp_path / "b.parquet", [make_row(0, 2.0, prompt=[8]), make_row(0, 0.0, prompt=[7])])
    files = [read(first), read(second)]
    built = build_samples(files, centred)
    assert built.groups_kept == 2  # group 0 of each file is its own group
    assert [s.input_tokens for s in built.samples] == [[1, 2, 3], [9], [8], [7]]
    assert [s.advantage for s in built.samples] == [0.5, -0.5, 1.0, -1.0]


def test_the_same_file_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "r.parquet", [make_row(0, 1.0), make_row(0, 0.0)])
    files = [read(path), read(path)]
    with pytest.raises(DuplicateRolloutError):
        build_samples(files, centred)


def test_rewards_all_equal_compares_exactly() -> None:
    assert rewards_all_equal([]) and rewards_all_equal([0.5]) and rewards_all_equal([1.0, 1.0, 1.0])
    assert rewards_all_equal([0.0, -0.0])
    assert not rewards_all_equal([1.0, 1.0, 0.999])


# --- collate ----------------------------------------------------------------------------------------------


def test_collate_pads_on_the_right_with_hand_checked_tensors() -> None:
    batch = collate([sample([1, 2, 3], [4, 5], 0.5), sample([6], [7, 8, 9], -1.0)], pad_id=PAD)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4]] * 2
    assert batch.targets.tolist() == [[2, 3, 4, 5, 0], [7, 8, 9, 0, 0]]
    assert batch.loss_mask.tolist() == [[False, False, True, True, False], [True, True, True, False, False]]
    assert batch.advantages.tolist() == [0.5, -1.0]
    assert batch.old_logprobs is None
    assert batch.input_ids.dtype == torch.int64 and batch.loss_mask.dtype == torch.bool


def test_loss_mask_selects_exactly_the_output_token_predictions() -> None:
    samples = [sample([5] * p, list(range(10, 10 + o))) for p, o in [(1, 1), (4, 2), (2, 7), (6, 3)]]
    batch = collate(samples, pad_id=PAD)
    B, T = batch.input_ids.shape
    assert (B, T) == (4, 9)
    for b, s in enumerate(samples):
        assert batch.targets[b][batch.loss_mask[b]].tolist() == s.output_tokens
        # the token before each target is the one the logits at that position saw last
        assert (
            batch.input_ids[b][batch.loss_mask[b]].tolist()
            == [*s.input_tokens, *s.output_tokens][-len(s.output_tokens) - 1 : -1]
        )


def test_collate_places_old_logprobs_at_the_loss_positions() -> None:
    batch = collate([sample([1, 2], [3, 4], old=[-0.5, -0.25]), sample([1], [2], old=[-2.0])], pad_id=PAD)
    assert batch.old_logprobs is not None
    assert batch.old_logprobs.tolist() == [[0.0, -0.5, -0.25, 0.0], [-2.0, 0.0, 0.0, 0.0]]


def test_collate_refuses_a_batch_with_only_some_old_logprobs() -> None:
    with pytest.raises(ValueError, match="every sample"):
        collate([sample([1], [2], old=[-1.0]), sample([1], [2])], pad_id=PAD)


@pytest.mark.parametrize(("prompt", "output"), [([], [2]), ([1], [])])
def test_collate_refuses_an_empty_prompt_or_completion(prompt: list[int], output: list[int]) -> None:
    with pytest.raises(ValueError, match="non-empty prompt and completion"):
        collate([sample([1], [2]), sample(prompt, output)], pad_id=PAD)


# --- the trainer's log-probs ----------------------------------------------------------------------------------


def unpadded_logprobs(model: PreTrainedModel, s: Sample) -> torch.Tensor:
    """Log-probs of the output tokens from a batch of one, with no padding and no mask."""
    ids = torch.tensor([s.input_tokens + s.output_tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # (L, V)
    logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)  # (L-1,)
    return logprobs[len(s.input_tokens) - 1 :]


def test_recompute_logprobs_equals_an_unpadded_forward_of_each_sequence(model: PreTrainedModel) -> None:
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 9), (12, 2), (1, 5), (7, 7)]
    samples = [
        sample(torch.randint(1, 250, (p,), generator=g).tolist(), torch.randint(1, 250, (o,), generator=g).tolist())
        for p, o in shapes
    ]
    batch = collate(samples, pad_id=PAD)
    logprobs = recompute_logprobs(model, batch)  # (B, T)
    assert logprobs.shape == batch.input_ids.shape and not logprobs.requires_grad
    assert torch.all(logprobs[~batch.loss_mask] == 0)
    for b, s in enumerate(samples):
        torch.testing.assert_close(logprobs[b][batch.loss_mask[b]], unpadded_logprobs(model, s), atol=1e-5, rtol=0)


def test_recompute_logprobs_keeps_the_graph_when_asked(model: PreTrainedModel) -> None:
    logprobs = recompute_logprobs(model, collate([sample([1, 2], [3])], pad_id=PAD), no_grad=False)
    assert logprobs.requires_grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_logprobs_match_what_the_same_model_recorded_while_generating(
    tmp_path: Path, model: PreTrainedModel, temperature: float
) -> None:
    config = model.config
    backend = TorchBackend(model, [config.eos_token_id], pad_token_id=config.pad_token_id, max_batch_size=4)
    prompts = [[70, 71, 72, 73], [80, 81], [90, 91, 92, 93, 94, 95]]
    requests = [GenerationRequest(prompt, seed) for prompt in prompts for seed in (1, 2)]
    completions = backend.generate(requests, SamplingParams(temperature=temperature, top_p=1.0, max_tokens=10))
    rows = [
        make_row(i // 2, float(i % 2), prompt=c.prompt_tokens, output_tokens=c.output_tokens,
                 output_logprobs=c.logprobs, finish_reason=c.finish_reason)
        for i, c in enumerate(completions)
    ]  # fmt: skip
    path = write(tmp_path / "generated.parquet", rows, temperature)
    built = build_samples([read(path)], centred)
    assert built.groups_kept == 3
    batch = collate(built.samples, pad_id=config.pad_token_id)
    logprobs = recompute_logprobs(model, batch, temperature=temperature)
    for b, row in enumerate(rows):
        recorded = torch.tensor(row.output_logprobs)  # float32 as stored
        torch.testing.assert_close(logprobs[b][batch.loss_mask[b]], recorded, atol=1e-5, rtol=0)


# --- the shared-prompt layout the learner trains on ------------------------------------------------------------


def grouped(prompt: list[int], outputs: list[list[int]], group: str) -> list[Sample]:
    return [
        Sample(prompt, out, None, float(i), reward=0.0, group_key=group, step=0, work_key=b"\x00")
        for i, out in enumerate(outputs)
    ]


def test_prompt_units_share_a_prompt_per_group_and_split_at_the_budget() -> None:
    a = grouped([1, 2, 3], [[4, 5], [6], [7, 8, 9]], "aa:0")
    b = grouped([1, 2, 3], [[4]], "aa:1")  # the same prompt in another group: its own unit
    units = prompt_units([a[0], b[0], a[1], a[2]], max_tokens=100)
    assert [(u.prompt, [s.output_tokens for s in u.samples]) for u in units] == [
        ([1, 2, 3], [[4, 5], [6], [7, 8, 9]]),
        ([1, 2, 3], [[4]]),
    ]
    assert units[0].n_tokens == 3 + 1 + 0 + 2  # the prompt, then each completion but its last token
    split = prompt_units(a, max_tokens=5)  # 3 + 1 + 0 fits, + 2 more does not
    assert [[s.output_tokens for s in u.samples] for u in split] == [[[4, 5], [6]], [[7, 8, 9]]]
    assert all(u.n_tokens <= 5 for u in split)


def test_collate_units_lays_out_a_hand_checked_batch() -> None:
    units = [
        PromptUnit([1, 2], grouped([1, 2], [[3, 4], [5, 6, 7]], "aa:0")),
        PromptUnit([8], grouped([8], [[9]], "bb:0")),
    ]
    batch = collate_units(units, pad_id=PAD)
    #         prompt | 1st completion but its last token | 2nd likewise
    assert batch.input_ids.tolist() == [[1, 2, 3, 5, 6], [8, 0, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 2, 3], [0, 0, 1, 2, 3]]
    assert batch.tokens == 5 + 1
    T = 5
    # output tokens: [3, 4] predicted at columns 1 (the prompt's last) and 2; [5, 6, 7] at 1, 3, 4; [9] at row 1's 0
    assert batch.positions.tolist() == [[1, 2, 0], [1, 3, 4], [T + 0, 0, 0]]
    assert batch.targets.tolist() == [[3, 4, PAD], [5, 6, 7], [9, PAD, PAD]]
    assert batch.loss_mask.tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    assert batch.advantages.tolist() == [0.0, 1.0, 0.0]
    assert batch.attention[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],  # the first completion sees the prompt and itself
        [1, 1, 0, 1, 0],  # the second sees the prompt, not the first completion
        [1, 1, 0, 1, 1],
    ]
    assert batch.attention[1, 0].int().tolist() == [[1, 0, 0, 0, 0]] + [
        [0] * c + [1] + [0] * (4 - c) for c in range(1, 5)
    ]


def test_collate_units_refuses_a_sample_of_another_prompt() -> None:
    with pytest.raises(ValueError, match="another prompt"):
        collate_units([PromptUnit([1, 2], grouped([1, 3], [[4]], "aa:0"))], pad_id=PAD)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_shared_logprobs_equal_an_unpadded_forward_of_each_sequence(implementation: str) -> None:
    model = build_model(seed=0)
    model.config._attn_implementation = implementation
    g = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(1, 250, (n,), generator=g).tolist()

    samples = grouped(tokens(9), [tokens(n) for n in (4, 1, 7)], "aa:0") + grouped(tokens(2), [tokens(3)], "bb:1")
    samples += grouped(tokens(12), [tokens(n) for n in (2, 5)], "cc:2")
    batch = collate_units(prompt_units(samples, max_tokens=1000), pad_id=PAD)
    with torch.no_grad():
        logprobs, entropy = shared_logprobs(model, batch, entropy=True)
    assert logprobs.shape == batch.loss_mask.shape == (6, 7) and entropy is not None
    order = [s for u in prompt_units(samples, max_tokens=1000) for s in u.samples]
    for n, s in enumerate(order):
        torch.testing.assert_close(logprobs[n][batch.loss_mask[n]], unpadded_logprobs(model, s), atol=1e-5, rtol=0)
    assert torch.all(entropy[batch.loss_mask] > 0)


def test_shared_logprobs_refuse_an_attention_without_custom_masks() -> None:
    model = build_model(seed=0)
    model.config._attn_implementation = "flash_attention_2"
    batch = collate_units(prompt_units(grouped([1, 2], [[3]], "aa:0"), max_tokens=10), pad_id=PAD)
    with pytest.raises(TrainerError, match="shared-prompt mask"):
        shared_logprobs(model, batch)


@pytest.mark.parametrize("entropy", [False, True])
def test_chunked_logprobs_and_their_gradients_are_the_plain_log_softmaxs(
    monkeypatch: pytest.MonkeyPatch, entropy: bool
) -> None:
    """`chosen_logprobs` takes the logits chunk by chunk under checkpointing (across three chunk boundaries here):
    the same log-probs, entropies and gradients as one log_softmax over every row."""
    from trainer import data

    monkeypatch.setattr(data, "LOGPROB_CHUNK_TOKENS", 128)
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(600, 97, generator=g) * 4).requires_grad_()
    rows = torch.randint(0, 600, (450,), generator=g)
    targets = torch.randint(0, 97, (450,), generator=g)
    weights = torch.randn(450, generator=g)
    picked, spread = data.chosen_logprobs(logits, rows, targets, 0.7, entropy=entropy)
    ((picked * weights).sum() + (spread.sum() if spread is not None else 0)).backward()
    chunked_grad, logits.grad = logits.grad, None
    plain = torch.log_softmax(logits[rows] / 0.7, dim=-1)
    expected = plain.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    expected_spread = -(plain.exp() * plain).sum(-1)
    ((expected * weights).sum() + (expected_spread.sum() if entropy else 0)).backward()
    torch.testing.assert_close(picked, expected, atol=1e-5, rtol=0)
    if entropy:
        assert spread is not None
        torch.testing.assert_close(spread, expected_spread, atol=1e-5, rtol=0)
    else:
        assert spread is None
    torch.testing.assert_close(chunked_grad, logits.grad, atol=1e-4, rtol=1e-5)  # float32 sums in another order
    with torch.no_grad():  # no graph: the chunks are computed once, not checkpointed
        again, _ = data.chosen_logprobs(logits, rows, targets, 0.7)
    torch.testing.assert_close(again, expected.detach(), atol=1e-5, rtol=0)
    empty, _ = data.chosen_logprobs(logits, rows[:0], targets[:0], 0.7)
    assert empty.shape == (0,)
