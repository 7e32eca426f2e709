"""Loads any causal LM saved in Hugging Face layout from a local directory: the tiny model here, a real Qwen on a GPU.

Nothing is fetched from a hub (`local_files_only=True` everywhere). The model hash identifies the weights a pool
trains (its on-chain `modelHash`) and the checkpoint a validator must prove against.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from core.errors import NodeError

CONFIG_FILE = "config.json"
_CHUNK_BYTES = 1 << 20
# What a bad directory raises inside transformers and safetensors: unreadable, malformed or mismatched files.
_LOAD_ERRORS = (OSError, ValueError, RuntimeError, KeyError, TypeError, SafetensorError)
# transformers' from_pretrained changes process-wide state while it builds a model (the meta-device init, the
# skipped weight init): two loads in two threads made one report its weights "newly initialized" and keep random
# values under the checkpoint's hash, and the other fail on meta tensors. A worker prefetching the next policy
# while another part of the process loads one would prove against weights nobody trained. One load at a time.
_LOAD_LOCK = threading.Lock()


class ModelLoadError(NodeError):
    """A model directory is missing, incomplete, or holds files that do not load."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"cannot load the model in {path}: {' '.join(detail.split())}")
        self.path = path
        self.detail = detail


@dataclass
class LoadedModel:
    """A model ready for inference, with what the sampler, the proof and the pool need to know about it."""

    model: PreTrainedModel  # eval mode, on the requested device and dtype
    tokenizer: PreTrainedTokenizerFast
    path: Path
    eos_token_ids: tuple[int, ...]  # generation stops at any of them
    model_hash: bytes  # 32 bytes, see `model_hash_of`

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head: the logits' last dimension (a real Qwen pads it past the tokenizer's ids)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def sampled_vocab_size(self) -> int:
        """N, the ids every role samples and checks over: the first N columns of the logits (`sampled_vocab`)."""
        return sampled_vocab(self.tokenizer, self.vocab_size)

    @property
    def hidden_size(self) -> int:
        """H of the hidden states `forward_hidden` returns, which the TOPLOC proofs are built from."""
        return int(self.model.config.get_text_config().hidden_size)

    @property
    def device(self) -> torch.device:
        return self.model.device


def model_positions(model: Any) -> int:
    """The longest sequence (prompt and completion) the model's config allows; 0 when it names none."""
    return int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 0)


def sampled_vocab(tokenizer: Any, head_rows: int) -> int:
    """The ids a model may sample: the tokenizer's (`len`, its added tokens included), never more than the LM head's
    rows. Qwen2.5 pads 151,665 ids to 151,936 rows; a padded row decodes to nothing, yet its logit is a number that
    can win, so workers draw from the first N logits only and validators reject any id past them. Every role takes
    N from here (the worker's backends, the validator's recompute and vocabulary check)."""
    return min(len(tokenizer), head_rows)


def weight_files(path: Path) -> list[Path]:
    """The directory's *.safetensors files, sorted by name (sharded checkpoints have several)."""
    return sorted((p for p in Path(path).glob("*.safetensors") if p.is_file()), key=lambda p: p.name)


def model_hash_of(path: Path) -> bytes:
    """sha256 over config.json, then every *.safetensors file in name order, read in 1 MiB chunks.

    Each file enters the hash as its name, a NUL byte, its size as 8 big-endian bytes, then its bytes, so
    moving bytes from one file to the next changes the hash. Tokenizer files are not covered: they do not
    change when training does.
    """
    path = Path(path)
    _check_layout(path)
    digest = hashlib.sha256()
    for file in [path / CONFIG_FILE, *weight_files(path)]:
        digest.update(file.name.encode() + b"\0" + file.stat().st_size.to_bytes(8, "big"))
        with file.open("rb") as handle:
            while chunk := handle.read(_CHUNK_BYTES):
                digest.update(chunk)
    return digest.digest()


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor stored in the directory's safetensors files and its shape, read from the files' headers only
    (the weights are not read); raises `ModelLoadError` naming the file that does not parse."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in weight_files(Path(path)):
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                    shapes[name] = tuple(int(dim) for dim in handle.get_slice(name).get_shape())
        except _LOAD_ERRORS as exc:
            raise ModelLoadError(Path(path), f"{file.name}: {exc}") from exc
    return shapes


def parameter_count(path: Path) -> int:
    """Parameters stored in the directory's safetensors files, read from their headers (tied weights count once)."""
    return sum(math.prod(shape) for shape in tensor_shapes(path).values())


def load_model(
    path: Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, progress: bool = False
) -> LoadedModel:
    """Loads the model and tokenizer in `path`; raises `ModelLoadError` naming the path on any failure.

    `progress` shows transformers' weight-loading bar: worth it for a real model, noise for the tiny one.
    """
    path = Path(path)
    _check_layout(path)
    try:
        with _LOAD_LOCK, transformers_progress(progress):
            # with output_loading_info it returns (model, info); transformers' stub names only the model
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, dtype=dtype, output_loading_info=True
            )
            model, info = loaded
    except _LOAD_ERRORS as exc:
        raise ModelLoadError(path, f"weights: {exc}") from exc
    if missing := sorted(info.get("missing_keys") or ()):  # transformers would fill them with random values
        raise ModelLoadError(path, f"weights: {len(missing)} tensors are missing from the checkpoint: {missing[:3]}")
    tokenizer = load_tokenizer(path)
    model = model.to(device).eval()  # type: ignore[arg-type]  # transformers' wrapper of `to` is mistyped
    eos_ids = eos_token_ids(model, tokenizer)
    if not eos_ids:
        raise ModelLoadError(path, "no EOS token in generation_config.json, config.json or the tokenizer")
    return LoadedModel(
        model=model, tokenizer=tokenizer, path=path, eos_token_ids=eos_ids, model_hash=model_hash_of(path)
    )


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """The directory's fast tokenizer (tokenizer.json and its chat template), without the weights."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except _LOAD_ERRORS as exc:
        raise ModelLoadError(path, f"tokenizer: {exc}") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ModelLoadError(path, f"needs a fast (tokenizer.json) tokenizer, found {type(tokenizer).__name__}")
    return tokenizer


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> tuple[int, ...]:
    """generation_config's EOS ids (a list for chat models), else config.json's, then the tokenizer's; no repeats."""
    ids: list[int] = []
    generation_config = getattr(model, "generation_config", None)
    for source in (getattr(generation_config, "eos_token_id", None), model.config.eos_token_id, tokenizer.eos_token_id):
        if source is None:
            continue
        for token_id in [source] if isinstance(source, int) else source:
            if int(token_id) not in ids:
                ids.append(int(token_id))
    return tuple(ids)


@contextmanager
def transformers_progress(enabled: bool) -> Iterator[None]:
    """Turns transformers' (process-wide) tqdm bars on or off for the block, then restores the previous setting."""
    before = hf_logging.is_progress_bar_enabled()
    if enabled:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if before:
            hf_logging.enable_progress_bar()
        else:
            hf_logging.disable_progress_bar()


def _check_layout(path: Path) -> None:
    """The cheap checks first, so the common mistakes (wrong path, a half-copied checkpoint) read clearly."""
    if not path.is_dir():
        raise ModelLoadError(path, "no such directory" if not path.exists() else "not a directory")
    if not (path / CONFIG_FILE).is_file():
        raise ModelLoadError(path, f"{CONFIG_FILE} is missing; a Hugging Face model directory has one")
    if not weight_files(path):
        raise ModelLoadError(path, "no *.safetensors weights (other formats are not loaded)")
