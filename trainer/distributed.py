"""Several training processes under torchrun: the process group, FSDP2 sharding of the model, and shutdown.

torchrun starts one process per rank and tells each who it is through the environment (WORLD_SIZE, RANK,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT). On CPU the ranks talk over gloo; with CUDA each rank drives the GPU of its
LOCAL_RANK, CUDA tensors travel over NCCL and CPU tensors (the learner's counters) still over gloo. The learner
(`trainer.learner`) is written for both: it deals micro-batches to ranks and undoes FSDP2's gradient averaging.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from trainer.errors import TrainerError
from trainer.learner import World
from trainer.precision import cuda_wanted

log = logging.getLogger(__name__)

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
COLLECTIVE_TIMEOUT = timedelta(minutes=10)  # a rank stuck this long in a collective fails instead of hanging


class DistributedError(TrainerError):
    """The process was started for several ranks but cannot join them, or the model cannot be sharded."""


def init_distributed(env: Mapping[str, str] | None = None, *, device: str = "auto") -> World:
    """Joins torchrun's process group when WORLD_SIZE > 1; one process alone gets `World()` and no group.

    `device` is the trainer's setting (`trainer.precision.DEVICES`): with CUDA each rank takes the GPU of its
    LOCAL_RANK and the group adds NCCL; `cpu` keeps every rank on gloo even where GPUs are present.
    """
    env = os.environ if env is None else env
    cuda = cuda_wanted(device)
    size = int(env.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    missing = [name for name in TORCHRUN_VARIABLES if not env.get(name)]
    if missing:
        raise DistributedError(f"WORLD_SIZE={size} but {', '.join(missing)} unset: start the ranks with torchrun")
    rank, local_rank = int(env["RANK"]), int(env["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local_rank)
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, rank=rank, world_size=size, timeout=COLLECTIVE_TIMEOUT)
    log.info("rank %d of %d joined the process group (%s)", rank, size, backend)
    return World(rank, size)


def shard_model(model: PreTrainedModel) -> int:
    """Shards `model` in place with FSDP2 across every rank; returns the number of decoder layers sharded.

    Each decoder layer is its own FSDP2 unit (gathered for its forward and backward, then freed); the root unit
    holds the rest: embeddings, final norm and LM head. With tied embeddings (`tie_word_embeddings`, as the tiny
    Qwen2) the LM head and the embedding are one parameter; both modules sit in the root unit, which shards the
    shared parameter once. Build the optimiser (the `Learner`) after this call: sharding replaces the parameters.
    The model is sharded where it lies: load it on the trainer's device first (`trainer.precision`), the CPU or
    this rank's GPU, matching the backend `init_distributed` chose.
    """
    if not dist.is_initialized():
        raise DistributedError("shard_model needs the process group: call init_distributed under torchrun first")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise DistributedError(f"{type(model).__name__} has no model.layers: cannot find its decoder layers")
    here = next(model.parameters()).device
    mesh = init_device_mesh(here.type, (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied and model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise DistributedError("sharding untied the LM head from the embedding: they must both sit in the root unit")
    log.info(
        "sharded %d decoder layers and the root over %d ranks (tied embeddings: %s)", len(layers), mesh.size(), tied
    )
    return len(layers)


def shutdown() -> None:
    """Leaves the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
