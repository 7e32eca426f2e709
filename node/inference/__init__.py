"""Verifiable sampling and the backends that generate with it (torch here, vLLM on a GPU)."""

from node.inference.base import Completion, FinishReason, GenerationRequest, InferenceBackend, InferenceError
from node.inference.sampler import (
    SamplingCheck,
    SamplingParams,
    SamplingParamsError,
    check_logprobs,
    check_sampled,
    sample_tokens,
)

__all__ = [
    "Completion",
    "FinishReason",
    "GenerationRequest",
    "InferenceBackend",
    "InferenceError",
    "SamplingCheck",
    "SamplingParams",
    "SamplingParamsError",
    "check_logprobs",
    "check_sampled",
    "sample_tokens",
]
