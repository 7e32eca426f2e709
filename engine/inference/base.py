"""What every inference backend takes and returns, so workers and validators never depend on which one ran.

A backend turns prompts and seeds into completions with the seeded sampler of `engine.inference.sampler`,
and returns, besides the tokens, what the rollout file and its proofs need: the log-prob of each token and
the final-norm hidden state that produced it (for output token i: the position len(prompt) + i - 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch

    from engine.inference.sampler import SamplingParams

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to draw; the seed fixes every sampling choice (taken modulo 2**64 as an int64)."""

    prompt_tokens: list[int]
    seed: int


@dataclass
class Completion:
    """One generated completion, as a rollout row records it."""

    prompt_tokens: list[int]
    output_tokens: list[int]  # EOS included when finish_reason is "stop"
    logprobs: list[float]  # log_softmax(logits / T)[token] for each output token
    finish_reason: FinishReason  # "stop": ended with an EOS token; "length": hit max_tokens
    hidden: torch.Tensor  # (n_out, H) float32 on CPU: final-norm hidden state that sampled each output token


class InferenceBackend(Protocol):
    """Batched, seeded generation. Results are in request order and do not depend on how requests are batched."""

    vocab_size: int  # N: the sampler draws from the first N logits, the tokenizer's ids (not the LM head's padding)

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        params: SamplingParams,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[Completion]:
        """Completes every request; `progress(n)` is called as n more completions finish."""
        ...
