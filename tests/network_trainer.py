"""The trainer.toml of a trainer in network mode, as the tests that start one as a process write it."""

from __future__ import annotations

from pathlib import Path

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
) -> Path:
    """`root/trainer.toml`: small assignments (2 prompts x 4), free ports, run folder `root/run`, the pool from
    `root/deployment.json`; with `p2p`, a gossip host on a free port too. Assignments are unlimited unless
    `files_per_node_per_step` says otherwise: most tests run workers against a trainer whose step never moves
    (no validator attests), and a node would run out of work at step 0."""
    path = root / "trainer.toml"
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
port = 0
prompts_per_task = 2
group_size = 4
files_per_node_per_step = {files_per_node_per_step}
[shardcast]
port = 0
{gossip}[pool]
id = {pool_id}
deployment = "deployment.json"
"""
    )
    return path
