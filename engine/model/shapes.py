"""Model shapes: the embedded tiny model and the real shape a pool runs, both Qwen2-architecture causal LMs built
locally from a seed (nothing can be downloaded here).

- `tiny`: 1.2M parameters, hidden 128, the byte tokenizer (263 ids, one embedding row each), float32: small enough
  to train and verify on 2 CPU cores, and the default of every command.
- `qwen2.5-0.5b`: Qwen2.5-0.5B's exact configuration (494M parameters: vocabulary 151,936, hidden 896, intermediate
  4,864, 24 layers, 14 attention heads sharing 2 key-value heads, tied embeddings, RoPE base 1e6, RMSNorm epsilon
  1e-6), with a byte-level BPE tokenizer trained here on the tasks' text (`engine.model.bpe`) whose ids are fewer
  than the embedding's rows, as Qwen's 151,665 are fewer than its 151,936. Saved in bfloat16, sharded.

`with_layers` makes a shallower variant of a shape (the same vocabulary and widths) for tests and volume.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Tokenizer = Literal["bytes", "bpe"]
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2-architecture shape. The defaults are the tiny model's (1,216,512 parameters, 4.9 MB in float32)."""

    name: str = "tiny"
    hidden_size: int = 128  # = the TOPLOC top-k (128), so a proof covers the whole hidden state
    num_hidden_layers: int = 6
    num_attention_heads: int = 4  # head_dim = hidden_size / heads = 32
    num_key_value_heads: int = 2  # grouped-query attention, as in Qwen2
    intermediate_size: int = 384  # SwiGLU width
    max_position_embeddings: int = 1024  # prompt + completion, in tokens
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02  # std of the normal init of every linear and embedding weight
    tokenizer: Tokenizer = "bytes"  # the byte tokenizer (engine.model.tokenizer) or a BPE trained on the tasks
    bpe_vocab: int = 0  # the BPE tokenizer's ids, its special and markup tokens included (tokenizer "bpe")
    embedding_rows: int | None = None  # rows of the embedding and LM head; None: exactly the tokenizer's ids
    dtype: str = "float32"  # the dtype the weights are saved in

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelShape.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads or (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"ModelShape: hidden_size {self.hidden_size} must split into {self.num_attention_heads} "
                "heads of even size (RoPE rotates pairs)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ModelShape: {self.num_attention_heads} attention heads do not share "
                f"{self.num_key_value_heads} key/value heads evenly"
            )
        if self.intermediate_size < 1 or self.max_position_embeddings < 2:
            raise ValueError("ModelShape: intermediate_size must be >= 1 and max_position_embeddings >= 2")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0 or self.initializer_range <= 0:
            raise ValueError("ModelShape: rope_theta, rms_norm_eps and initializer_range must be positive")
        if self.tokenizer == "bpe" and not 512 <= self.bpe_vocab <= (self.embedding_rows or self.bpe_vocab):
            raise ValueError(
                f"ModelShape: a BPE vocabulary of {self.bpe_vocab} ids must be at least 512 (the 256 bytes and "
                f"their first merges) and at most the {self.embedding_rows} embedding rows"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"ModelShape.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    def with_layers(self, layers: int) -> ModelShape:
        """The same shape, `layers` deep (named so: 'qwen2.5-0.5b-2l')."""
        if not 1 <= layers <= self.num_hidden_layers:
            raise ValueError(
                f"{self.name} has {self.num_hidden_layers} layers: --layers must be in [1, {self.num_hidden_layers}]"
            )
        if layers == self.num_hidden_layers:
            return self
        return replace(self, name=f"{self.name}-{layers}l", num_hidden_layers=layers)


TINY = ModelShape()
QWEN25_05B = ModelShape(
    name="qwen2.5-0.5b",
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    initializer_range=0.02,
    tokenizer="bpe",
    bpe_vocab=8192,  # what the tasks' text supports; Qwen's 151,665 come from a web-scale corpus
    embedding_rows=151_936,
    dtype="bfloat16",
)
SHAPES = {shape.name: shape for shape in (TINY, QWEN25_05B)}
