"""`NodeConfig`: what `prime-node start` reads from node.toml's `[worker]` table and its flags.

Every key is declared once here (core.config), with its type, default, bounds and flag, but for those every daemon
shares (state and where the pool's parts are: protocol.pool_spec.DaemonSettings); configs/node.toml shows them. The
file overrides the defaults and a flag overrides the file; relative paths in the file are resolved against its
folder; unknown keys, wrong types and values out of bounds are refused naming the file and the key, or the flag.
The worker's own defaults (batch size, submit batch and pace, claim pace, backend, device) are `WorkerSettings`'
(node/daemon/worker.py): declared there, taken here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from core.config import setting
from engine.inference.select import BACKENDS, DEVICES
from node.daemon.worker import WorkerSettings
from protocol.pool_spec import DaemonSettings, state_setting

MAX_PORT = 65535


@dataclass(frozen=True)
class NodeConfig(DaemonSettings):
    """The worker's settings (`prime-node start`); the pool's parts default to its spec on chain."""

    TABLE: ClassVar[str] = "worker"

    state: Path | None = state_setting("journal, files and weights; None: ~/.local/share/prime-node/pool-N/ADDRESS")
    # generation
    batch_size: int = setting(
        "sequences decoded together", default=WorkerSettings.batch_size, flag="--batch-size", minimum=1, maximum=4096
    )
    backend: str = setting(
        "inference engine (auto: vLLM when a build for the device is installed)",
        default=WorkerSettings.backend,
        flag="--backend",
        choices=BACKENDS,
    )
    device: str = setting(
        "where to generate (auto: CUDA when torch sees a GPU)",
        default=WorkerSettings.device,
        flag="--device",
        choices=DEVICES,
    )
    threads: int = setting(
        "torch CPU threads (0: torch's default)", default=0, flag="--threads", minimum=0, maximum=1024
    )
    max_files: int | None = setting(
        "stop after this many files (0: make none); None: no limit", default=None, flag="--max-files", minimum=0
    )
    # the chain
    submit_batch: int = setting(
        "files per submitWorkBatch transaction",
        default=WorkerSettings.submit_batch,
        flag="--submit-batch",
        minimum=1,
        maximum=256,
    )
    submit_every: float = setting(
        "seconds an uploaded file waits at most for a full batch",
        default=WorkerSettings.submit_every,
        above=0,
        maximum=86_400,
    )
    claim: bool = setting(
        "claim rewards whose challenge window has passed", default=WorkerSettings.claim, flag="--claim"
    )
    claim_every: float = setting(
        "seconds between looks at the chain for invalidations and claims",
        default=WorkerSettings.claim_every,
        above=0,
        maximum=86_400,
    )
    join: bool = setting("join the pool when not a member yet", default=WorkerSettings.join, flag="--join")
    # serving
    metrics_port: int | None = setting(
        "serve /metrics on 127.0.0.1 (0: any port)", default=None, flag="--metrics-port", minimum=0, maximum=MAX_PORT
    )
    dashboard_port: int | None = setting(
        "serve the dashboard on 127.0.0.1 (0: any port); None: off unless --dashboard",
        default=None,
        flag="--dashboard-port",
        minimum=0,
        maximum=MAX_PORT,
    )
    p2p_port: int | None = setting(
        "join the pool's gossip on this port (0: any)", default=None, flag="--p2p-port", minimum=0, maximum=MAX_PORT
    )
