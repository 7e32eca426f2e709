"""Models built here from a seed: the embedded default (a tiny Qwen2-architecture causal LM) and the real shape a
pool runs (`engine.model.shapes`), written in Hugging Face layout.

The tiny model has the real architecture (GQA attention, RoPE, RMSNorm, SwiGLU, tied embeddings), so every code path
that serves, proves and trains it serves a real Qwen too, yet it is small enough (1.2M parameters) to train and
verify on 2 CPU cores. `prime-train init-model` calls `init_model` (`--shape qwen2.5-0.5b` for the real shape);
`prime-train sft` then warm-starts it.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from core.errors import NodeError
from engine.model.loading import transformers_progress
from engine.model.shapes import TINY, ModelShape
from engine.model.tokenizer import IM_END, PAD_TOKEN, build_tokenizer
from protocol.tasks.spec import TaskSpec

ONE_FILE_BYTES = 64 << 20  # weights up to this are one file; more are two or more and an index, as real checkpoints
SHARD_BYTES = 512 << 20  # the largest shard (a tensor larger than this has one of its own)


class ModelDirExistsError(NodeError):
    """The output directory already holds something and overwriting was not asked for."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"refusing to overwrite {path}: it exists and is not empty (pass --overwrite to replace it)")
        self.path = path


def qwen2_config(shape: ModelShape, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """The Hugging Face config: the shape plus the tokenizer's special ids, and its vocabulary as the embedding's
    rows unless the shape pads them (Qwen's 151,936)."""
    pad_id = tokenizer.get_vocab()[PAD_TOKEN]
    eos_id = tokenizer.get_vocab()[IM_END]
    rows = shape.embedding_rows or len(tokenizer)  # exact by default: the sampler can never pick an undecodable id
    if rows < len(tokenizer):
        raise ValueError(f"{shape.name}: {rows} embedding rows cannot hold the tokenizer's {len(tokenizer)} ids")
    return Qwen2Config(
        vocab_size=rows,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        rms_norm_eps=shape.rms_norm_eps,
        initializer_range=shape.initializer_range,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=pad_id,  # as Qwen: no BOS is prepended, <|endoftext|> stands in
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype=shape.dtype,
    )


def shape_tokenizer(shape: ModelShape, specs: Sequence[TaskSpec] = ()) -> PreTrainedTokenizerFast:
    """The tokenizer a shape is built with: the byte tokenizer, or a BPE of `shape.bpe_vocab` ids trained on the
    problems of `specs` and reasoning-gym's (engine.model.bpe)."""
    if shape.tokenizer == "bytes":
        return build_tokenizer()
    from engine.model.bpe import reasoning_texts, task_texts, train_bpe

    return train_bpe(itertools.chain(task_texts(specs), reasoning_texts()), shape.bpe_vocab)


def build_model(
    shape: ModelShape | None = None, *, seed: int = 0, tokenizer: PreTrainedTokenizerFast | None = None
) -> Qwen2ForCausalLM:
    """A randomly initialised model of `shape` (default: the tiny one) in the shape's dtype; `tokenizer` defaults
    to the byte tokenizer. The caller's torch RNG state is left as it was."""
    shape = shape or TINY
    hf_config = qwen2_config(shape, tokenizer or build_tokenizer())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(hf_config).float()  # initialised in float32 whatever it is saved in
    model = model.to(getattr(torch, shape.dtype))
    # Stop at the end of a chat turn or of a document, pad with <|endoftext|> (Qwen2.5-Instruct's settings).
    model.generation_config = GenerationConfig(
        bos_token_id=hf_config.bos_token_id,
        eos_token_id=[hf_config.eos_token_id, hf_config.pad_token_id],
        pad_token_id=hf_config.pad_token_id,
    )
    return model.eval()


def init_model(
    out_dir: Path,
    *,
    seed: int = 0,
    shape: ModelShape | None = None,
    specs: Sequence[TaskSpec] = (),
    overwrite: bool = False,
) -> Path:
    """Writes a fresh model of `shape` (default: the tiny one) to `out_dir` in Hugging Face layout and returns the
    directory; a BPE shape's tokenizer is trained on the problems of `specs` and reasoning-gym's.

    Files: config.json, generation_config.json, the weights (model.safetensors, or for a model past
    ONE_FILE_BYTES model-0000i-of-0000n.safetensors and their index), tokenizer.json, tokenizer_config.json,
    chat_template.jinja. The same seed writes byte-identical weights. The directory appears complete or not
    at all: everything is written to a temporary sibling, flushed to disk, then renamed into place.

    Raises `ModelDirExistsError` when `out_dir` exists and is not empty, unless `overwrite`.
    """
    out_dir = Path(out_dir)
    _check_target(out_dir, overwrite=overwrite)
    shape = shape or TINY
    tokenizer = shape_tokenizer(shape, specs)
    return save_model_dir(build_model(shape, seed=seed, tokenizer=tokenizer), tokenizer, out_dir, overwrite=overwrite)


def save_model_dir(
    model: PreTrainedModel, tokenizer: Any, out_dir: Path, *, overwrite: bool = False, dtype: str | None = None
) -> Path:
    """Writes `model` and `tokenizer` to `out_dir` in Hugging Face layout, complete or not at all; weights past
    ONE_FILE_BYTES are split over at least two files and an index, as real checkpoints are. `dtype` ("bfloat16"):
    the weights as that precision holds them, config.json saying so; None: as the model holds them."""
    out_dir = Path(out_dir)
    _check_target(out_dir, overwrite=overwrite)
    if dtype is not None and getattr(torch, dtype) == model.dtype:
        dtype = None  # held in it already: written as it is
    weights = _in_precision(model, dtype)
    weight_bytes = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in weights.values()}.values())
    shard = weight_bytes + 1 if weight_bytes <= ONE_FILE_BYTES else min(SHARD_BYTES, weight_bytes // 2 + 1)
    with _staging_dir(out_dir) as staging:
        with transformers_progress(False):  # a few shards: a bar would only flash
            model.save_pretrained(staging, max_shard_size=shard, state_dict=weights)
        if dtype is not None:
            config = json.loads((staging / "config.json").read_text())
            (staging / "config.json").write_text(
                json.dumps({**config, "dtype": dtype}, indent=2, sort_keys=True) + "\n"
            )
        tokenizer.save_pretrained(staging)
        _finish_files(staging)
        _check_target(out_dir, overwrite=overwrite)  # again: it may have appeared while we wrote
        _replace_dir(staging, out_dir)
    return out_dir


def _in_precision(model: PreTrainedModel, dtype: str | None) -> dict[str, torch.Tensor]:
    """The model's state dict, each tensor in `dtype` (None: as held); tensors that share storage (a tied head)
    still share it, so the head is written once."""
    state = model.state_dict()
    if dtype is None:
        return state
    kind = getattr(torch, dtype)
    converted: dict[int, torch.Tensor] = {}
    for tensor in state.values():
        if tensor.data_ptr() not in converted:
            converted[tensor.data_ptr()] = tensor.detach().to(kind)
    return {name: converted[t.data_ptr()] for name, t in state.items()}


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
