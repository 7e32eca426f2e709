"""The `--backend` and `--device` options every command that generates takes (engine.inference.select)."""

from __future__ import annotations

import typer

from engine.inference.select import BACKENDS, DEVICES

BackendOption = typer.Option(
    "--backend",
    metavar="|".join(BACKENDS),
    help="Inference engine: vllm, torch, or auto (vLLM when a build for the device is installed) [auto].",
)
DeviceOption = typer.Option(
    "--device",
    metavar="|".join(DEVICES),
    help="Where to generate: cpu, cuda, or auto (CUDA when torch sees a GPU) [auto].",
)
