"""The embedded default model: its size, determinism from the seed, the files it writes, and a forward pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.model.forward import forward_hidden
from engine.model.loading import load_model, parameter_count
from engine.model.shapes import ModelShape
from engine.model.tiny import ModelDirExistsError, build_model, init_model
from engine.model.tokenizer import build_tokenizer

HF_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


@pytest.fixture(scope="module")
def seed0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("tiny") / "seed0", seed=0)


def test_default_model_has_one_to_three_million_parameters(seed0: Path) -> None:
    count = parameter_count(seed0)
    assert 1_000_000 <= count <= 3_000_000
    assert count == build_model().num_parameters()  # tied LM head stored once, counted once


def test_writes_hugging_face_layout_and_nothing_else_next_to_it(seed0: Path) -> None:
    assert {path.name for path in seed0.iterdir()} >= HF_FILES
    assert [path.name for path in seed0.parent.iterdir()] == ["seed0"]  # no temporary sibling left behind
    config = json.loads((seed0 / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["vocab_size"] == len(build_tokenizer())
    assert config["tie_word_embeddings"] is True
    assert config["hidden_size"] == ModelShape().hidden_size


def test_generation_config_stops_at_im_end_and_endoftext(seed0: Path) -> None:
    tokenizer = build_tokenizer()
    generation = json.loads((seed0 / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert generation["pad_token_id"] == tokenizer.pad_token_id


def test_same_seed_writes_byte_identical_weights(seed0: Path, tmp_path: Path) -> None:
    again = init_model(tmp_path / "again", seed=0)
    assert (again / "model.safetensors").read_bytes() == (seed0 / "model.safetensors").read_bytes()
    assert (again / "config.json").read_bytes() == (seed0 / "config.json").read_bytes()


def test_different_seeds_write_different_weights(seed0: Path, tmp_path: Path) -> None:
    other = load_file(init_model(tmp_path / "seed1", seed=1) / "model.safetensors")
    base = load_file(seed0 / "model.safetensors")
    assert other.keys() == base.keys()
    assert not torch.equal(other["model.embed_tokens.weight"], base["model.embed_tokens.weight"])


def test_init_leaves_the_callers_random_state_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_refuses_a_non_empty_directory_and_leaves_it_untouched(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ModelDirExistsError, match="refusing to overwrite"):
        init_model(out)
    assert [path.name for path in out.iterdir()] == ["notes.txt"]
    assert [path.name for path in tmp_path.iterdir()] == ["model"]


def test_overwrite_replaces_the_directory_whole(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("old")
    init_model(out, overwrite=True)
    assert "notes.txt" not in {path.name for path in out.iterdir()}
    assert {path.name for path in out.iterdir()} >= HF_FILES
    assert [path.name for path in tmp_path.iterdir()] == ["model"]


def test_an_empty_existing_directory_is_filled(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    assert {path.name for path in init_model(tmp_path / "model").iterdir()} >= HF_FILES


@pytest.mark.parametrize(
    "fields",
    [{"hidden_size": 130}, {"num_attention_heads": 3}, {"num_key_value_heads": 3}, {"num_hidden_layers": 0}],
)
def test_config_rejects_shapes_the_architecture_cannot_take(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="ModelShape"):
        ModelShape(**fields)


def test_forward_hidden_returns_the_lm_head_input_and_the_models_logits(seed0: Path) -> None:
    loaded = load_model(seed0)
    input_ids = torch.tensor([loaded.tokenizer.encode("12+30=42"), loaded.tokenizer.encode("<think>7*6=42</think>")])
    out = forward_hidden(loaded.model, input_ids)
    B, T = input_ids.shape
    assert out.hidden.shape == (B, T, ModelShape().hidden_size)
    assert out.logits.shape == (B, T, len(loaded.tokenizer))
    with torch.inference_mode():
        reference = loaded.model(input_ids).logits  # (B, T, V)
        head_of_hidden = out.hidden @ loaded.model.lm_head.weight.T  # (B, T, H) @ (H, V)
    torch.testing.assert_close(out.logits, reference, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.logits, head_of_hidden, rtol=0, atol=1e-5)
