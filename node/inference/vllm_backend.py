"""The vLLM backend (extra `gpu`): vLLM runs the model, our seeded sampler picks every token.

Written against vLLM 0.33 (its V2 model runner) and checked only where CUDA is present. Three pieces:
- a forward hook on the model's `logits_processor` layer keeps the hidden states the logits come from:
  the final-norm output at exactly the positions that sample, one row per request;
- a custom logits processor (vLLM's public plug-in point) runs `sample_tokens` on the raw logits and
  forces its choice (every other logit -inf), so vLLM's own sampler, greedy here, can only agree;
- both record per (request, output position) the token, its log-prob and its hidden state.
The hook and the processor live in vLLM's engine, so the engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) and one VLLMBackend exists per process.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from node.inference.base import Completion, GenerationRequest, InferenceError
from node.inference.sampler import SamplingParams, sample_tokens, seed_to_int64

if TYPE_CHECKING:
    from node.model.loading import LoadedModel

VLLM_MISSING = "vLLM is not installed: pip install 'prime-node[gpu]'"
EXTRA_ARGS_KEY = "prime_node"  # our per-request settings inside vLLM's SamplingParams.extra_args


@dataclass(frozen=True)
class _Row:
    key: int  # our request id, unique in this process
    seed: int
    prompt_len: int
    params: SamplingParams


@dataclass
class Recorder:
    """What the hook and the processor saw, keyed by (request key, output position); later writes win.

    A preempted request is recomputed with the same seeds and positions, so a rewrite holds the same values.
    """

    hidden: torch.Tensor | None = None  # (rows, H): input of the latest logits computation
    records: dict[tuple[int, int], tuple[int, float, torch.Tensor]] | None = None

    def capture(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        """Forward hook on vLLM's logits layer, called as `logits_processor(lm_head, hidden_states)`."""
        self.hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]

    def take_hidden(self, rows: int) -> torch.Tensor:
        hidden, self.hidden = self.hidden, None
        if hidden is None or hidden.shape[0] != rows:
            got = "nothing" if hidden is None else f"{hidden.shape[0]} rows"
            raise InferenceError(f"the hidden-state hook captured {got} for {rows} logits rows: vLLM's layout changed")
        return hidden

    def record(self, keys: list[int], positions: list[int], tokens: torch.Tensor, logprobs: torch.Tensor,
               hidden: torch.Tensor) -> None:  # fmt: skip
        if self.records is None:
            self.records = {}
        cpu_hidden = hidden.float().cpu()  # (n, H)
        for i, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
            self.records[(keys[i], positions[i])] = (token, logprob, cpu_hidden[i])


class GumbelMaxRows:
    """The logits processor's logic, free of vLLM types: per batch slot, which of our requests sits there.

    `apply` takes the raw (rows, V) float32 logits, the slot of each row and the tokens visible to it
    (prompt + outputs so far); a row then samples output position seq_len - prompt_len.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.rows: dict[int, _Row] = {}

    def add_request(self, slot: int, extra_args: Mapping[str, Any] | None) -> bool:
        """A request enters `slot` (recycled: whatever was there is forgotten); True if it is ours."""
        ours = (extra_args or {}).get(EXTRA_ARGS_KEY)
        if ours is None:
            self.rows.pop(slot, None)
            return False
        params = SamplingParams(ours["temperature"], ours["top_p"], ours["max_tokens"])
        self.rows[slot] = _Row(key=ours["key"], seed=ours["seed"], prompt_len=ours["prompt_len"], params=params)
        return True

    def apply(self, logits: torch.Tensor, slots: Sequence[int], seq_lens: Sequence[int]) -> torch.Tensor:
        if logits.shape[0] != len(slots):
            raise InferenceError(
                f"{logits.shape[0]} logits rows for {len(slots)} requests: prime-node's sampler needs one row "
                "per request (turn speculative decoding off)"
            )
        groups: dict[SamplingParams, list[tuple[int, _Row, int]]] = {}
        for batch_index, slot in enumerate(slots):
            row = self.rows.get(int(slot))
            position = int(seq_lens[batch_index]) - row.prompt_len if row is not None else -1
            if row is not None and position >= 0:  # < 0: a chunk of the prompt, whose sample vLLM drops
                groups.setdefault(row.params, []).append((batch_index, row, position))
        if not groups:
            return logits
        hidden = self.recorder.take_hidden(logits.shape[0])  # (rows, H)
        for params, members in groups.items():
            index = torch.tensor([m[0] for m in members], dtype=torch.int64, device=logits.device)
            seeds = torch.tensor([m[1].seed for m in members], dtype=torch.int64, device=logits.device)
            positions = [m[2] for m in members]
            tokens, logprobs = sample_tokens(
                logits[index], seeds, torch.tensor(positions, dtype=torch.int64, device=logits.device), params
            )
            self.recorder.record([m[1].key for m in members], positions, tokens, logprobs, hidden[index])
            forced = torch.full((len(members), logits.shape[1]), -math.inf, dtype=logits.dtype, device=logits.device)
            logits[index] = forced.scatter_(1, tokens.unsqueeze(-1), 0.0)  # only our token can be picked
        return logits


RECORDER = Recorder()  # one per process: vLLM builds the processor itself, so it finds the recorder here


@functools.cache
def _processor_class() -> type:
    """vLLM's V2 logits-processor interface, implemented by `GumbelMaxRows` (built lazily: vLLM is optional)."""
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor

    class GumbelMaxProcessor(LogitsProcessor):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, req_states: Any) -> None:
            self.rows = GumbelMaxRows(RECORDER)

        def add_request(self, req_idx: int, sampling_params: Any) -> bool:
            return self.rows.add_request(req_idx, sampling_params.extra_args)

        def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
            # Without speculative decoding a row is a request and its seq_len bound is exact.
            return self.rows.apply(logits, ctx.idx_mapping_np.tolist(), ctx.seq_lens_upper_bound_np.tolist())

    return GumbelMaxProcessor


def _install_hook(model: torch.nn.Module) -> Any:
    layer = getattr(model, "logits_processor", None)
    if not isinstance(layer, torch.nn.Module):
        raise InferenceError(f"{type(model).__name__} has no `logits_processor` layer to capture hidden states from")
    return layer.register_forward_hook(RECORDER.capture, with_kwargs=True)


class VLLMBackend:
    """`InferenceBackend` on vLLM; outputs match `TorchBackend` up to the GPU's float error."""

    _keys = itertools.count()

    def __init__(
        self,
        model_path: str | Path,
        eos_token_ids: Sequence[int],
        *,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        **engine_kwargs: Any,
    ) -> None:
        try:
            from vllm import LLM
            from vllm import SamplingParams as VLLMSamplingParams
            from vllm.inputs import TokensPrompt
        except ImportError as exc:
            raise InferenceError(VLLM_MISSING) from exc
        if not eos_token_ids:
            raise InferenceError("VLLMBackend needs at least one EOS token id to know when a completion ends")
        # The hook and the processor share RECORDER with us: keep vLLM's engine in this process, on the
        # model runner whose logits-processor interface `_processor_class` implements.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self._prompt_type, self._params_type = TokensPrompt, VLLMSamplingParams
        self.llm = LLM(
            model=str(model_path),
            dtype=dtype,
            enforce_eager=True,  # hooks do not run inside captured CUDA graphs
            async_scheduling=False,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            logits_processors=[_processor_class()],
            **engine_kwargs,
        )
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self._hooks = self.llm.apply_model(_install_hook)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **kwargs: Any) -> VLLMBackend:
        """vLLM loads the weights itself from `loaded.path`; only the EOS ids are taken from `loaded`."""
        return cls(loaded.path, loaded.eos_token_ids, **kwargs)

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        params: SamplingParams,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[Completion]:
        """vLLM schedules the batch itself; `progress` is called once, when all requests are done."""
        keys = [next(self._keys) for _ in requests]
        prompts, settings = [], []
        for index, (key, request) in enumerate(zip(keys, requests, strict=True)):
            prompt = request.prompt_tokens
            if not prompt or len(prompt) + params.max_tokens > self.max_model_len:
                raise InferenceError(
                    f"request {index}: prompt of {len(prompt)} tokens + max_tokens {params.max_tokens} must fit "
                    f"in 1..{self.max_model_len} positions"
                )
            ours: dict[str, float] = {"key": key, "seed": seed_to_int64(request.seed), "prompt_len": len(prompt)}
            ours |= {"temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens}
            prompts.append(self._prompt_type(prompt_token_ids=list(prompt)))
            settings.append(
                self._params_type(
                    temperature=0.0,  # greedy over the forced logits: picks our token
                    max_tokens=params.max_tokens,
                    ignore_eos=True,  # stop exactly at our EOS ids, not the ones vLLM reads elsewhere
                    stop_token_ids=list(self.eos_token_ids),
                    detokenize=False,
                    extra_args={EXTRA_ARGS_KEY: ours},
                )
            )
        RECORDER.records = {}
        try:
            outputs = self.llm.generate(prompts, settings, use_tqdm=False)
            records = RECORDER.records
        finally:
            RECORDER.records = None
        completions = [self._completion(key, request, output, records) for key, request, output in
                       zip(keys, requests, outputs, strict=True)]  # fmt: skip
        if progress is not None:
            progress(len(completions))
        return completions

    def _completion(
        self, key: int, request: GenerationRequest, output: Any, records: dict[tuple[int, int], Any]
    ) -> Completion:
        sample = output.outputs[0]
        tokens = [int(t) for t in sample.token_ids]
        reason = sample.finish_reason
        if reason not in ("stop", "length"):
            raise InferenceError(f"vLLM finished a request with reason {reason!r}; expected 'stop' or 'length'")
        logprobs, hidden = [], []
        for position, token in enumerate(tokens):
            seen = records.get((key, position))
            if seen is None or seen[0] != token:
                raise InferenceError(
                    f"output position {position}: vLLM emitted token {token} but the sampler chose "
                    f"{None if seen is None else seen[0]}; the logits processor did not run as expected"
                )
            logprobs.append(seen[1])
            hidden.append(seen[2])
        return Completion(
            prompt_tokens=list(request.prompt_tokens),
            output_tokens=tokens,
            logprobs=logprobs,
            finish_reason=reason,
            hidden=torch.stack(hidden) if hidden else torch.empty(0, 0),
        )
