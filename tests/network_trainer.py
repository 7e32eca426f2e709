"""The trainer.toml of a trainer in network mode, as the tests that start one as a process write it."""

from __future__ import annotations

from pathlib import Path

from ledger.chain import free_port

TASK = Path(__file__).resolve().parents[1] / "configs" / "tasks" / "default.toml"


def write_trainer_config(
    root: Path,
    model: Path,
    pool_id: int,
    *,
    steps: int,
    rollouts_per_step: int,
    async_level: int = 2,
    p2p: bool = False,
    files_per_node_per_step: int = 0,
    spec_file: Path | None = None,
) -> Path:
    """`root/trainer.toml`: small assignments (2 prompts x 4), free ports, run folder `root/run`, the pool from
    `root/deployment.json`; with `p2p`, a gossip host on a free port too. Assignments are unlimited unless
    `files_per_node_per_step` says otherwise: most tests run workers against a trainer whose step never moves
    (no validator attests), and a node would run out of work at step 0.

    With `spec_file` (the pool's specURI), the coordinator and origin get free ports picked here, and the pool spec is
    written first, naming them: a trainer in network mode reads the pool's terms from it as it starts."""
    path = root / "trainer.toml"
    api_port, origin_port = (free_port(), free_port()) if spec_file is not None else (0, 0)
    if spec_file is not None:
        spec_file.write_text(
            f'coordinator = "http://127.0.0.1:{api_port}"\ncheckpoints = ["http://127.0.0.1:{origin_port}"]\n'
            f'task = "{TASK}"\nasync_level = {async_level}\nprompts_per_task = 2\ngroup_size = 4\n'
        )
    gossip = "[p2p]\nport = 0\n" if p2p else ""
    path.write_text(
        f"""[run]
dir = "run"
model = "{model}"
task = "{TASK}"
steps = {steps}
threads = 1
[data]
async_level = {async_level}
rollouts_per_step = {rollouts_per_step}
[coordinator]
port = {api_port}
prompts_per_task = 2
group_size = 4
files_per_node_per_step = {files_per_node_per_step}
[shardcast]
port = {origin_port}
{gossip}[pool]
id = {pool_id}
deployment = "deployment.json"
"""
    )
    return path
