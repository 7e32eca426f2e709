"""Where the trainer computes and in which dtype: `--device` / `--dtype` (and `[run]` device, dtype) resolved once.

device: "auto" (CUDA when torch sees a GPU, else the CPU), "cpu" or "cuda" (an error without a GPU, never a silent
fallback). dtype is the COMPUTE dtype: "float32", or "bfloat16" for forward and backward under
`torch.autocast(device_type, dtype=torch.bfloat16)`; "auto" is bfloat16 on CUDA and float32 on the CPU.

Whatever the compute dtype, the master weights, the gradients, AdamW's state and every checkpoint stay float32:
workers and validators load a checkpoint in their own precision, and a bfloat16 master copy would lose the small
updates (bfloat16 keeps 8 bits of mantissa: an update under 1/256 of a weight would round away). Log-probs are taken
of float32 logits (`trainer.data.shared_logprobs` casts them before log_softmax), so the GRPO ratio is exact.

torch loads inside the functions, so the CLI can import the choices before its arguments are parsed.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from trainer.errors import TrainerError

if TYPE_CHECKING:
    import torch


class Device(StrEnum):
    """Where to train: the `--device` choices and `[run] device` of trainer.toml."""

    AUTO = "auto"  # CUDA when torch.cuda.is_available(), else the CPU
    CPU = "cpu"
    CUDA = "cuda"  # an error on a machine without a CUDA GPU


class Dtype(StrEnum):
    """The compute dtype: the `--dtype` choices and `[run] dtype` of trainer.toml."""

    AUTO = "auto"  # bfloat16 on CUDA, float32 on the CPU
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"  # autocast; the weights stay float32


DEVICES: tuple[str, ...] = tuple(d.value for d in Device)
DTYPES: tuple[str, ...] = tuple(d.value for d in Dtype)


class PrecisionError(TrainerError, ValueError):
    """A device or dtype that is not one of the choices, or that this machine cannot train on."""


@dataclass(frozen=True)
class Precision:
    """The resolved choice: `device` the model lives on, `dtype` its forward and backward compute in."""

    device: torch.device  # cpu, or cuda:<the current GPU> (under torchrun: the rank's, set by init_distributed)
    dtype: torch.dtype  # torch.float32 or torch.bfloat16; the weights themselves are float32 either way
    reason: str  # why this choice, for the log line

    def autocast(self) -> AbstractContextManager[object]:
        """The context forward and backward run in: autocast to bfloat16, or nothing for float32."""
        import torch

        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def describe(self) -> str:
        """One line for the log, like "training on cpu in float32: no CUDA GPU"."""
        return f"training on {self.device} in {str(self.dtype).removeprefix('torch.')}: {self.reason}"


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """`value` if it is one of `choices`; else `PrecisionError` naming the setting."""
    if value not in choices:
        raise PrecisionError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def resolve_precision(device: str = "auto", dtype: str = "auto", *, cuda: bool | None = None) -> Precision:
    """(device, dtype) settings -> a `Precision`; raises `PrecisionError` on a bad value or `cuda` without a GPU.

    `cuda` says whether this machine has a CUDA GPU; None asks torch (`torch.cuda.is_available()`).
    """
    import torch

    check_choice("dtype", dtype, DTYPES)
    on_cuda = cuda_wanted(device, cuda=cuda)
    gpu = torch.cuda.get_device_name() if on_cuda and torch.cuda.is_available() else "a CUDA GPU"
    if device == "auto":
        why = f"{gpu} present (device auto)" if on_cuda else "no CUDA GPU (device auto)"
    else:
        why = f"device {device} asked for"
    place = torch.device("cpu")
    if on_cuda:  # the current GPU: under torchrun init_distributed made it the rank's; unindexed if `cuda` was told
        place = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cuda")
    if dtype == "auto":
        compute = torch.bfloat16 if on_cuda else torch.float32
        why += ", dtype auto: bfloat16 on CUDA" if on_cuda else ", dtype auto: float32 on the CPU"
    else:
        compute = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        why += f", dtype {dtype} asked for"
    if compute == torch.bfloat16:
        why += " (autocast; weights, optimizer state and checkpoints stay float32)"
    return Precision(place, compute, why)


def cuda_wanted(device: str, *, cuda: bool | None = None) -> bool:
    """Whether the `device` setting resolves to CUDA here (`cuda` as in `resolve_precision`); `PrecisionError` for
    a bad value or `cuda` without a GPU. It touches no GPU: `init_distributed` asks it before a rank takes its own.
    """
    check_choice("device", device, DEVICES)
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise PrecisionError(
            "device cuda asked for, but torch sees no CUDA GPU (torch.cuda.is_available() is false): "
            "use device auto or cpu"
        )
    return device == "cuda" or (device == "auto" and cuda)
