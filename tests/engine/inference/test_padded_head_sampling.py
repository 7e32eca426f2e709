"""The engines sample the tokenizer's ids only: an LM head padded past them (a real Qwen's 151,936 rows for 151,665
ids) never gives a token no text has, and a model whose tokenizer covers every row generates what it always did."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.generate import generate_rollouts
from engine.inference.base import GenerationRequest
from engine.inference.sampler import SamplingParams, sample_tokens
from engine.inference.torch_backend import TorchBackend
from engine.inference.vllm_backend import EXTRA_ARGS_KEY, GumbelMaxRows, Recorder
from engine.model.loading import LoadedModel, load_model, sampled_vocab
from engine.model.tiny import init_model
from protocol.plan import Job
from protocol.tasks.sources import open_source
from protocol.tasks.spec import load_task_spec
from tests.padded_vocabulary import PADDING, padded_tiny_model

TASK = Path(__file__).resolve().parents[3] / "configs" / "tasks" / "default.toml"
NODE = "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65"
IDS = 263  # the byte tokenizer's


@pytest.fixture(scope="module", autouse=True)
def single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def padded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(padded_tiny_model(tmp_path_factory.mktemp("padded") / "model"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(init_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


def _requests(loaded: LoadedModel, count: int) -> list[GenerationRequest]:
    prompts = ["12+30=", "Think for 8 tokens. 7*6=", "a", "What is 99-1?"]
    return [GenerationRequest(loaded.tokenizer.encode(prompts[i % 4]), seed=1_000 + i) for i in range(count)]


def test_the_sampled_ids_are_the_tokenizers_never_more_than_the_heads_rows(
    padded: LoadedModel, tiny: LoadedModel
) -> None:
    assert (padded.vocab_size, padded.sampled_vocab_size) == (IDS + PADDING, IDS)
    assert (tiny.vocab_size, tiny.sampled_vocab_size) == (IDS, IDS)
    assert sampled_vocab(range(500), 300) == 300  # a tokenizer larger than the head: only rows have logits


@pytest.mark.parametrize(
    "params",
    [SamplingParams(1.0, 1.0, 24), SamplingParams(1.5, 0.9, 24), SamplingParams(0.0, 1.0, 24)],
    ids=["t1", "t1.5-p0.9", "greedy"],
)
def test_the_torch_backend_never_samples_a_padded_id(padded: LoadedModel, params: SamplingParams) -> None:
    backend = TorchBackend.from_loaded(padded, max_batch_size=64)
    assert backend.vocab_size == IDS  # what the worker's tamper fault and prompt check bound ids by
    completions = backend.generate(_requests(padded, 64), params)
    tokens = [t for c in completions for t in c.output_tokens]
    assert len(tokens) >= 64 and max(tokens) < IDS
    # the premise: over every row, the padded ones win nearly every draw
    everything = TorchBackend(padded.model, padded.eos_token_ids, pad_token_id=0, max_batch_size=64)
    unsliced = [t for c in everything.generate(_requests(padded, 8), params) for t in c.output_tokens]
    assert sum(t >= IDS for t in unsliced) > 0.9 * len(unsliced)


def test_a_model_whose_tokenizer_covers_every_row_writes_the_same_file(tiny: LoadedModel, tmp_path: Path) -> None:
    """The tiny model (263 ids, 263 rows): sampling the tokenizer's ids is sampling every row, byte for byte."""
    spec = load_task_spec(TASK)
    source = open_source(spec)
    job = Job(pool_id=1, node=NODE, step=3, counter=7, prompts=3, group_size=4)
    pad = tiny.tokenizer.pad_token_id
    every_row = TorchBackend(tiny.model, tiny.eos_token_ids, pad_token_id=int(pad) if pad is not None else 0)
    assert every_row.vocab_size == TorchBackend.from_loaded(tiny).vocab_size == IDS
    ours = generate_rollouts(job, spec, source, tiny, TorchBackend.from_loaded(tiny)).write(tmp_path / "a.parquet")
    before = generate_rollouts(job, spec, source, tiny, every_row).write(tmp_path / "b.parquet")
    assert ours.work_key == before.work_key
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def _ours(key: int, seed: int, vocab: int | None, params: SamplingParams) -> dict[str, Any]:
    settings = {"key": key, "seed": seed, "prompt_len": 3, "temperature": params.temperature, "top_p": params.top_p}
    return {EXTRA_ARGS_KEY: settings | {"max_tokens": params.max_tokens, "vocab": vocab}}


def test_the_vllm_processor_samples_the_first_n_logits_and_forces_the_padding_out() -> None:
    """vLLM hands the processor every row's logit; padded columns far above the rest never win, are -inf in what
    goes back to vLLM, and the recorded log-prob is over the first N columns, as the validator recomputes it."""
    params = SamplingParams(1.0, 1.0, 8)
    recorder = Recorder(records={})
    rows = GumbelMaxRows(recorder)
    assert rows.add_request(0, _ours(key=1, seed=5, vocab=40, params=params))
    assert rows.add_request(1, _ours(key=2, seed=6, vocab=None, params=params))  # no count: every column
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    logits[:, 40:] = 1_000.0  # padded rows that would win every draw
    raw = logits.clone()
    recorder.capture(torch.nn.Identity(), (None, torch.zeros(2, 4)), {}, None)
    out = rows.apply(logits, [0, 0])
    assert out.shape == (2, 50)  # full width back to vLLM
    token, logprob = sample_tokens(raw[0:1, :40], torch.tensor([5]), torch.tensor([0]), params)
    assert int(out[0].argmax()) == int(token[0]) < 40 and torch.isinf(out[0]).sum() == 49
    assert recorder.records is not None
    assert recorder.records[(1, 0)][:2] == (int(token[0]), pytest.approx(float(logprob[0])))
    assert int(out[1].argmax()) >= 40  # the row without a count still draws from all 50, as before
