"""`WorkerSettings`: the worker's one settings type, what `prime-node start` reads from node.toml's `[worker]` table
and its flags, and what the daemon (node/daemon/worker.py) runs by, on chain or in local mode.

Every key is declared once here (core.config), with its type, default, bounds and flag, but for those every daemon
shares (state and where the pool's parts are: protocol.pool_spec.DaemonSettings); configs/node.toml shows them. The
file overrides the defaults and a flag overrides the file; relative paths in the file are resolved against its
folder; unknown keys, wrong types and values out of bounds are refused naming the file and the key, or the flag.
What binds every member of the pool (its terms: async level, file size, assignment timing) is not a setting: it
comes with the pool (`protocol.pool_spec.Pool`), which the daemon is given beside these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from core.config import port_setting, setting
from engine.inference.select import BACKENDS, DEVICES
from protocol.pool_spec import DaemonSettings, state_setting

DAY = 86_400


@dataclass(frozen=True)
class WorkerSettings(DaemonSettings):
    """The worker's settings; the pool's parts default to its spec on chain."""

    TABLE: ClassVar[str] = "worker"

    state: Path | None = state_setting("journal, files and weights; None: ~/.local/share/prime-node/pool-N/ADDRESS")
    # generation
    batch_size: int = setting("sequences decoded together", default=64, flag="--batch-size", minimum=1, maximum=4096)
    backend: str = setting(
        "inference engine (auto: vLLM when a build for the device is installed)",
        default="auto",
        flag="--backend",
        choices=BACKENDS,
    )
    device: str = setting(
        "where to generate (auto: CUDA when torch sees a GPU)", default="auto", flag="--device", choices=DEVICES
    )
    threads: int = setting(
        "torch CPU threads (0: torch's default)", default=0, flag="--threads", minimum=0, maximum=1024
    )
    max_files: int | None = setting(
        "stop after this many files (0: make none); None: no limit", default=None, flag="--max-files", minimum=0
    )
    # the chain
    submit_batch: int = setting(
        "files per batch: one Merkle root per submitBatch transaction",
        default=4,
        flag="--submit-batch",
        minimum=1,
        maximum=256,
    )
    submit_every: float = setting(
        "seconds an uploaded file waits at most for a full batch", default=10.0, above=0, maximum=DAY
    )
    claim: bool = setting("claim rewards whose challenge window has passed", default=False, flag="--claim")
    claim_every: float = setting(
        "seconds between looks at the chain for invalidations and claims", default=60.0, above=0, maximum=DAY
    )
    join: bool = setting("join the pool when not a member yet", default=False, flag="--join")
    # staying up
    max_failures: int = setting("failed iterations in a row before exiting 1", default=20, minimum=1, maximum=1_000_000)
    retry_seconds: float = setting(
        "wait after an unreachable coordinator or a failed iteration", default=1.0, above=0, maximum=3600
    )
    patience: float | None = setting(
        "seconds the coordinator may stay unreachable before exiting 0; None: no limit", default=None, minimum=0
    )
    # serving
    metrics_port: int | None = port_setting("serve /metrics on 127.0.0.1 (0: any port)", flag="--metrics-port")
    dashboard_port: int | None = port_setting(
        "serve the dashboard on 127.0.0.1 (0: any port); None: off unless --dashboard", flag="--dashboard-port"
    )
    relay_port: int | None = port_setting(
        "mirror the checkpoint sources and serve them on this port (0: any); None: no relay unless --relay",
        flag="--relay-port",
    )
    relay_host: str = setting(
        "the relay's address; 0.0.0.0 to serve other machines", default="127.0.0.1", flag="--relay-host"
    )
    p2p_port: int | None = port_setting("join the pool's gossip on this port (0: any)", flag="--p2p-port")
