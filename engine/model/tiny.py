"""The embedded default model: a tiny Qwen2-architecture causal LM, randomly initialised from a seed.

It has the real architecture (GQA attention, RoPE, RMSNorm, SwiGLU, tied embeddings), so every code path that
serves, proves and trains it serves a real Qwen too, yet it is small enough (1.2M parameters) to train and
verify on 2 CPU cores. `prime-train init-model` calls `init_model`; `prime-train sft` then warm-starts it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from core.errors import NodeError
from engine.model.loading import transformers_progress
from engine.model.tokenizer import IM_END, PAD_TOKEN, build_tokenizer


class ModelDirExistsError(NodeError):
    """The output directory already holds something and overwriting was not asked for."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"refusing to overwrite {path}: it exists and is not empty (pass --overwrite to replace it)")
        self.path = path


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny model. The defaults give 1,216,512 parameters (float32, 4.9 MB on disk)."""

    hidden_size: int = 128  # = the TOPLOC top-k (128), so a proof covers the whole hidden state
    num_hidden_layers: int = 6
    num_attention_heads: int = 4  # head_dim = hidden_size / heads = 32
    num_key_value_heads: int = 2  # grouped-query attention, as in Qwen2
    intermediate_size: int = 384  # SwiGLU width
    max_position_embeddings: int = 1024  # prompt + completion, in characters
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02  # std of the normal init of every linear and embedding weight

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"TinyModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads or (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"TinyModelConfig: hidden_size {self.hidden_size} must split into {self.num_attention_heads} "
                "heads of even size (RoPE rotates pairs)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"TinyModelConfig: {self.num_attention_heads} attention heads do not share "
                f"{self.num_key_value_heads} key/value heads evenly"
            )
        if self.intermediate_size < 1 or self.max_position_embeddings < 2:
            raise ValueError("TinyModelConfig: intermediate_size must be >= 1 and max_position_embeddings >= 2")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0 or self.initializer_range <= 0:
            raise ValueError("TinyModelConfig: rope_theta, rms_norm_eps and initializer_range must be positive")


def qwen2_config(config: TinyModelConfig) -> Qwen2Config:
    """The Hugging Face config: the tiny shape plus the tokenizer's vocabulary and special ids."""
    tokenizer = build_tokenizer()
    pad_id = tokenizer.get_vocab()[PAD_TOKEN]
    eos_id = tokenizer.get_vocab()[IM_END]
    return Qwen2Config(
        vocab_size=len(tokenizer),  # exactly the tokenizer's ids: the sampler can never pick an undecodable one
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        rms_norm_eps=config.rms_norm_eps,
        initializer_range=config.initializer_range,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=pad_id,  # as Qwen: no BOS is prepended, <|endoftext|> stands in
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def build_model(config: TinyModelConfig | None = None, *, seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised model; the caller's torch RNG state is left as it was."""
    hf_config = qwen2_config(config or TinyModelConfig())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(hf_config).float()
    # Stop at the end of a chat turn or of a document, pad with <|endoftext|> (Qwen2.5-Instruct's settings).
    model.generation_config = GenerationConfig(
        bos_token_id=hf_config.bos_token_id,
        eos_token_id=[hf_config.eos_token_id, hf_config.pad_token_id],
        pad_token_id=hf_config.pad_token_id,
    )
    return model.eval()


def init_model(out_dir: Path, *, seed: int = 0, config: TinyModelConfig | None = None, overwrite: bool = False) -> Path:
    """Writes a fresh tiny model to `out_dir` in Hugging Face layout and returns the directory.

    Files: config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
    chat_template.jinja. The same seed writes byte-identical weights. The directory appears complete or not
    at all: everything is written to a temporary sibling, flushed to disk, then renamed into place.

    Raises `ModelDirExistsError` when `out_dir` exists and is not empty, unless `overwrite`.
    """
    out_dir = Path(out_dir)
    _check_target(out_dir, overwrite=overwrite)
    return save_model_dir(build_model(config, seed=seed), build_tokenizer(), out_dir, overwrite=overwrite)


def save_model_dir(model: PreTrainedModel, tokenizer: Any, out_dir: Path, *, overwrite: bool = False) -> Path:
    """Writes `model` and `tokenizer` to `out_dir` in Hugging Face layout, complete or not at all."""
    out_dir = Path(out_dir)
    _check_target(out_dir, overwrite=overwrite)
    with _staging_dir(out_dir) as staging:
        with transformers_progress(False):  # one small shard: a bar would only flash
            model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        _finish_files(staging)
        _check_target(out_dir, overwrite=overwrite)  # again: it may have appeared while we wrote
        _replace_dir(staging, out_dir)
    return out_dir


def _check_target(out_dir: Path, *, overwrite: bool) -> None:
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if out_dir.is_dir() and not out_dir.is_symlink() and not any(out_dir.iterdir()):
        return
    if not overwrite or not out_dir.is_dir() or out_dir.is_symlink():
        raise ModelDirExistsError(out_dir)


@contextmanager
def _staging_dir(out_dir: Path) -> Iterator[Path]:
    """A fresh hidden sibling of `out_dir` (same filesystem, so the final rename is atomic), removed on failure."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # a no-op after a successful rename


def _replace_dir(staging: Path, out_dir: Path) -> None:
    """Renames `staging` to `out_dir`; an existing `out_dir` is first moved aside, then deleted."""
    if not out_dir.exists():
        staging.rename(out_dir)
        return
    old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:12]}"
    out_dir.rename(old)
    try:
        staging.rename(out_dir)
    except OSError:
        old.rename(out_dir)  # put the previous model back rather than leave nothing
        raise
    shutil.rmtree(old, ignore_errors=True)


def _finish_files(directory: Path) -> None:
    """Makes every file world-readable (transformers writes the weights 0600) and flushes the files and the
    directory, so a crash after the rename never leaves empty files behind a complete-looking name."""
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(0o644)
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
