"""Verifiable sampling and the backends that generate with it (torch here, vLLM on a GPU).

The names below load on first use, not with the package: `engine.inference.select` (which every command that
generates names in its options) must import without torch, so that `prime-node relay`, `origin` and
`fetch-weights` start, run and exit without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Completion": "base",
    "FinishReason": "base",
    "GenerationRequest": "base",
    "InferenceBackend": "base",
    "InferenceError": "errors",
    "SamplingCheck": "sampler",
    "SamplingParams": "sampler",
    "SamplingParamsError": "sampler",
    "check_logprobs": "sampler",
    "check_sampled": "sampler",
    "sample_tokens": "sampler",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
