"""The real shape (Qwen2.5-0.5B's configuration) built here: its exact configuration, a shallower variant of it, a
BPE tokenizer trained on the tasks with fewer ids than the embedding's rows, sharded bfloat16 weights, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from engine.model.bpe import BpeTrainingError, task_texts, train_bpe
from engine.model.loading import load_model, model_hash_of, parameter_count, weight_files
from engine.model.shapes import QWEN25_05B, SHAPES, ModelShape
from engine.model.tiny import build_model, init_model, qwen2_config, shape_tokenizer
from engine.model.tokenizer import IM_END, IM_START, PAD_TOKEN
from protocol.tasks.spec import load_task_spec
from trainer.cli import app

TASK = Path(__file__).resolve().parents[3] / "configs" / "tasks" / "default.toml"


@pytest.fixture(scope="module")
def bpe() -> object:
    return shape_tokenizer(QWEN25_05B, [load_task_spec(TASK)])


@pytest.fixture(scope="module")
def two_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shape = QWEN25_05B.with_layers(2)
    return init_model(tmp_path_factory.mktemp("real") / "q2", seed=3, shape=shape, specs=[load_task_spec(TASK)])


def test_the_shape_is_qwen2_5_0_5b_and_has_its_494m_parameters(bpe: object) -> None:
    config = qwen2_config(QWEN25_05B, bpe)  # type: ignore[arg-type]
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (151_936, 896, 4864)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (24, 14, 2)
    assert config.tie_word_embeddings and config.rms_norm_eps == 1e-6
    assert config.rope_parameters["rope_theta"] == 1_000_000.0
    with torch.device("meta"):  # the count without the memory
        model = build_model(QWEN25_05B, tokenizer=bpe)  # type: ignore[arg-type]
    assert model.num_parameters() == 494_032_768  # Qwen2.5-0.5B's published count
    assert SHAPES["qwen2.5-0.5b"] is QWEN25_05B and QWEN25_05B.with_layers(24) is QWEN25_05B


def test_a_shallower_variant_keeps_the_widths_and_a_bad_depth_is_refused() -> None:
    two = QWEN25_05B.with_layers(2)
    assert (two.name, two.num_hidden_layers, two.hidden_size, two.embedding_rows) == (
        "qwen2.5-0.5b-2l",
        2,
        896,
        151_936,
    )
    for layers in (0, 25):
        with pytest.raises(ValueError, match=r"--layers must be in \[1, 24\]"):
            QWEN25_05B.with_layers(layers)
    with pytest.raises(ValueError, match="BPE vocabulary"):
        ModelShape(tokenizer="bpe", bpe_vocab=200)


def test_the_bpe_tokenizer_has_qwens_markup_fewer_ids_than_rows_and_round_trips(bpe: object) -> None:
    tokenizer = bpe
    vocab = tokenizer.get_vocab()  # type: ignore[attr-defined]
    assert len(tokenizer) == QWEN25_05B.bpe_vocab < QWEN25_05B.embedding_rows  # type: ignore[arg-type]
    assert max(vocab.values()) == len(tokenizer) - 1  # type: ignore[arg-type]
    assert {PAD_TOKEN, IM_START, IM_END} <= set(vocab)
    text = "Calculate 13 - 92.\nReply with <answer>N</answer>. Über naïve café: ünïcödé ✓"
    ids = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    assert tokenizer.decode(ids) == text and len(ids) < len(text.encode()) * 0.8  # type: ignore[attr-defined]
    chat = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert chat[0] == vocab[IM_START] and tokenizer.decode(chat).endswith("<|im_start|>assistant\n")  # type: ignore[attr-defined]


def test_the_same_texts_train_the_same_tokenizer_and_no_text_is_refused() -> None:
    texts = list(task_texts([load_task_spec(TASK)], per_task=500))
    first, second = train_bpe(texts, 600), train_bpe(iter(texts), 600)
    assert first.get_vocab() == second.get_vocab()
    with pytest.raises(BpeTrainingError, match="no texts"):
        train_bpe([], 600)
    with pytest.raises(BpeTrainingError, match="256 bytes"):
        train_bpe(texts, 100)


def test_two_layers_save_sharded_in_bfloat16_and_load_with_the_padded_head(two_layers: Path) -> None:
    files = [path.name for path in weight_files(two_layers)]
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((two_layers / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(files)
    config = json.loads((two_layers / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["vocab_size"] == 151_936 and config["num_hidden_layers"] == 2
    loaded = load_model(two_layers, dtype=torch.bfloat16)
    assert loaded.vocab_size == 151_936 and len(loaded.tokenizer) == QWEN25_05B.bpe_vocab
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert parameter_count(two_layers) == loaded.model.num_parameters()
    again = init_model(
        two_layers.parent / "again", seed=3, shape=QWEN25_05B.with_layers(2), specs=[load_task_spec(TASK)]
    )
    assert model_hash_of(again) == model_hash_of(two_layers)  # the same seed, the same bytes


def test_init_model_makes_a_real_shape_from_the_command_line_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "q1"
    args = ["init-model", "--out", str(out), "--shape", "qwen2.5-0.5b", "--layers", "1", "--dtype", "float32"]
    result = runner.invoke(app, [*args, "--task", str(TASK), "--json"])
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    assert (made["shape"], made["dtype"], made["path"]) == ("qwen2.5-0.5b-1l", "float32", str(out.resolve()))
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    refused = runner.invoke(app, ["init-model", "--out", str(tmp_path / "x"), "--shape", "qwen3"])
    assert refused.exit_code != 0 and "choose one of tiny, qwen2.5-0.5b" in refused.output
    assert not (tmp_path / "x").exists()
