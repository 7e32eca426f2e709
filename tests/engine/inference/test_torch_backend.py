"""The torch backend on a real tiny Qwen2: batch invariance, the validator's view, EOS and limits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.inference.base import Completion, GenerationRequest
from engine.inference.errors import InferenceError
from engine.inference.sampler import SamplingParams, check_logprobs, check_sampled
from engine.inference.torch_backend import TorchBackend
from engine.model.forward import forward_hidden

VOCAB = 96
NO_EOS = 95  # an EOS id the tests treat as ordinary; completions may or may not reach it
PARAMS = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24)


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).float().eval()


@pytest.fixture(scope="module")
def requests() -> list[GenerationRequest]:
    """16 prompts of 1 to 40 tokens, so batches are heavily left-padded."""
    rng = torch.Generator().manual_seed(7)
    lengths = [5, 40, 1, 17, 33, 2, 9, 28, 12, 3, 38, 21, 7, 14, 26, 30]
    return [
        GenerationRequest(prompt_tokens=torch.randint(0, VOCAB - 1, (n,), generator=rng).tolist(), seed=1000 + i)
        for i, n in enumerate(lengths)
    ]


@pytest.fixture(scope="module")
def batch16(model: Qwen2ForCausalLM, requests: list[GenerationRequest]) -> list[Completion]:
    return TorchBackend(model, [NO_EOS], pad_token_id=0).generate(requests, PARAMS)


def _assert_same(a: Completion, b: Completion) -> None:
    assert a.output_tokens == b.output_tokens
    assert a.finish_reason == b.finish_reason
    assert float((a.hidden - b.hidden).abs().max()) < 1e-5
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_a_request_gives_the_same_completion_alone_and_in_padded_batches(
    model: Qwen2ForCausalLM, requests: list[GenerationRequest], batch16: list[Completion]
) -> None:
    backend = TorchBackend(model, [NO_EOS], pad_token_id=0)
    for index in (0, 2, 10):  # prompt lengths 5, 1 and 38 in a batch whose longest prompt has 40
        alone = backend.generate([requests[index]], PARAMS)[0]
        in_four = backend.generate(requests[index : index + 4] if index < 12 else requests[12:], PARAMS)[0]
        _assert_same(alone, in_four)
        _assert_same(alone, batch16[index])


def test_chunking_by_max_batch_size_does_not_change_completions(
    model: Qwen2ForCausalLM, requests: list[GenerationRequest], batch16: list[Completion]
) -> None:
    chunked = TorchBackend(model, [NO_EOS], pad_token_id=0, max_batch_size=3).generate(requests, PARAMS)
    for a, b in zip(chunked, batch16, strict=True):
        _assert_same(a, b)


def test_requests_sharing_a_prompt_share_its_prefill_and_complete_as_if_alone(
    model: Qwen2ForCausalLM, requests: list[GenerationRequest]
) -> None:
    """A group: one prefill per distinct prompt, its keys and values copied to each request (seeds differ)."""
    prompts = [requests[0].prompt_tokens, requests[1].prompt_tokens, requests[2].prompt_tokens]
    grouped = [GenerationRequest(prompts[i % 3], seed=500 + i) for i in range(9)]  # interleaved groups of 3
    backend = TorchBackend(model, [NO_EOS], pad_token_id=0)
    together = backend.generate(grouped, PARAMS)
    assert len({tuple(c.output_tokens) for c in together}) > 3  # the seeds, not the shared prefill, decide
    for request, completion in zip(grouped, together, strict=True):
        _assert_same(backend.generate([request], PARAMS)[0], completion)


def test_hidden_states_logprobs_and_tokens_match_a_single_prefill(
    model: Qwen2ForCausalLM, batch16: list[Completion], requests: list[GenerationRequest]
) -> None:
    """What a validator recomputes from prompt + completion alone, with no knowledge of the batch."""
    for completion, request in zip(batch16, requests, strict=True):
        start, n = len(completion.prompt_tokens) - 1, len(completion.output_tokens)
        out = forward_hidden(model, torch.tensor([completion.prompt_tokens + completion.output_tokens]))
        hidden, logits = out.hidden[0, start : start + n], out.logits[0, start : start + n]  # (n, H), (n, V)
        assert completion.hidden.shape == (n, 64) and completion.hidden.dtype == torch.float32
        assert float((hidden - completion.hidden).abs().max()) < 1e-4
        tokens = torch.tensor(completion.output_tokens)
        assert check_logprobs(logits, tokens, completion.logprobs, PARAMS, atol=1e-4).ok
        verdict = check_sampled(logits, tokens, request.seed, torch.arange(n), PARAMS)  # exact on CPU float32
        assert verdict.ok, verdict.detail


def test_greedy_decoding_follows_the_prefill_argmax(model: Qwen2ForCausalLM, requests: list[GenerationRequest]) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    for completion in TorchBackend(model, [NO_EOS], pad_token_id=0).generate(requests[:4], greedy):
        start, n = len(completion.prompt_tokens) - 1, len(completion.output_tokens)
        logits = forward_hidden(model, torch.tensor([completion.prompt_tokens + completion.output_tokens])).logits
        assert completion.output_tokens == logits[0, start : start + n].argmax(-1).tolist()


def test_generation_stops_at_the_first_eos_and_keeps_it(
    model: Qwen2ForCausalLM, requests: list[GenerationRequest], batch16: list[Completion]
) -> None:
    reference = batch16[3]
    eos = reference.output_tokens[5]  # a token this completion produces, made the EOS
    first = reference.output_tokens.index(eos)
    stopped = TorchBackend(model, [eos, NO_EOS], pad_token_id=0).generate(requests, PARAMS)
    assert stopped[3].output_tokens == reference.output_tokens[: first + 1]
    assert stopped[3].finish_reason == "stop"
    assert stopped[3].hidden.shape[0] == first + 1
    for completion, full in zip(stopped, batch16, strict=True):  # every row is a prefix of its unstopped run
        n = len(completion.output_tokens)
        assert completion.output_tokens == full.output_tokens[:n]
        assert float((completion.hidden - full.hidden[:n]).abs().max()) < 1e-5


def test_finish_reasons_and_max_tokens(batch16: list[Completion]) -> None:
    assert {c.finish_reason for c in batch16} <= {"stop", "length"}
    for completion in batch16:
        n = len(completion.output_tokens)
        assert 1 <= n <= PARAMS.max_tokens and len(completion.logprobs) == n
        if completion.finish_reason == "stop":
            assert completion.output_tokens.index(NO_EOS) == n - 1
        else:
            assert n == PARAMS.max_tokens and NO_EOS not in completion.output_tokens
    assert any(c.finish_reason == "length" for c in batch16)


def test_progress_reports_every_completion_once(model: Qwen2ForCausalLM, requests: list[GenerationRequest]) -> None:
    reported: list[int] = []
    TorchBackend(model, [NO_EOS], pad_token_id=0, max_batch_size=5).generate(
        requests[:7], SamplingParams(max_tokens=4), progress=reported.append
    )
    assert sum(reported) == 7 and all(n > 0 for n in reported)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "message"),
    [
        ([1] * 500, 13, "exceeds the model's 512 positions"),
        ([], 4, "prompt is empty"),
        ([1, VOCAB], 4, r"must be in \[0, 96\)"),
    ],
)
def test_rejects_requests_the_model_cannot_run(
    model: Qwen2ForCausalLM, prompt: list[int], max_tokens: int, message: str
) -> None:
    backend = TorchBackend(model, [NO_EOS], pad_token_id=0)
    fine = GenerationRequest([1, 2], seed=0)
    with pytest.raises(InferenceError, match=message):
        backend.generate([fine, GenerationRequest(prompt, seed=1)], SamplingParams(max_tokens=max_tokens))


def test_from_loaded_generates_with_the_tiny_model_directory(tmp_path: Path) -> None:
    from engine.model.loading import load_model
    from engine.model.tiny import init_model

    loaded = load_model(init_model(tmp_path / "tiny", seed=3))
    backend = TorchBackend.from_loaded(loaded, max_batch_size=2)
    prompt = loaded.tokenizer.encode("12+30=")
    completions = backend.generate([GenerationRequest(prompt, seed=s) for s in range(3)], SamplingParams(max_tokens=6))
    assert [c.prompt_tokens for c in completions] == [prompt] * 3
    for completion in completions:
        assert completion.hidden.shape == (len(completion.output_tokens), loaded.hidden_size)
        assert completion.finish_reason == "length" or completion.output_tokens[-1] in loaded.eos_token_ids
