"""The trainer.toml of a trainer, as the tests that start one as a process write it: the tables every mode has
(`trainer_toml`), and a network-mode trainer's whole file (`write_trainer_config`)."""

from __future__ import annotations

from pathlib import Path

from ledger.chain import free_port

TASK = Path(__file__).resolve().parents[1] / "configs" / "tasks" / "default.toml"

TomlValue = str | int | bool


def toml_value(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def trainer_toml(
    model: Path,
    *,
    steps: int,
    async_level: int,
    rollouts_per_step: int,
    serve_after: bool = False,
    **tables: dict[str, TomlValue],
) -> str:
    """The text of a trainer.toml: `[run]` (run folder `run`, the default task, one thread) and `[data]`, which
    every mode has, then `tables` in their order, each `name={key: value}` (the mode's own: `coordinator`,
    `shardcast`, `local` or `pool` ...)."""
    every = {
        "run": {"dir": "run", "model": str(model), "task": str(TASK), "steps": steps, "threads": 1}
        | ({"serve_after": True} if serve_after else {}),
        "data": {"async_level": async_level, "rollouts_per_step": rollouts_per_step},
    }
    return "".join(
        f"[{name}]\n" + "".join(f"{key} = {toml_value(value)}\n" for key, value in table.items())
        for name, table in (every | tables).items()
    )


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
    max_files_in_flight: int = 0,
    spec_file: Path | None = None,
    serve_after: bool = False,
) -> Path:
    """`root/trainer.toml`: small assignments (2 prompts x 4), free ports, run folder `root/run`, the pool from
    `root/deployment.json`; with `p2p`, a gossip host on a free port too. Assignments are unlimited unless
    `files_per_node_per_step` or `max_files_in_flight` says otherwise: most tests run workers against a trainer whose
    step never moves (no validator attests), and a node would run out of work at step 0.

    With `spec_file` (the pool's specURI), the coordinator and origin get free ports picked here, and the pool spec is
    written first, naming them: a trainer in network mode reads the pool's terms from it as it starts."""
    path = root / "trainer.toml"
    api_port, origin_port = (free_port(), free_port()) if spec_file is not None else (0, 0)
    if spec_file is not None:
        spec_file.write_text(
            f'coordinator = "http://127.0.0.1:{api_port}"\ncheckpoints = ["http://127.0.0.1:{origin_port}"]\n'
            f'task = "{TASK}"\nasync_level = {async_level}\nprompts_per_task = 2\ngroup_size = 4\n'
        )
    path.write_text(
        trainer_toml(
            model,
            steps=steps,
            async_level=async_level,
            rollouts_per_step=rollouts_per_step,
            serve_after=serve_after,
            coordinator={
                "port": api_port,
                "prompts_per_task": 2,
                "group_size": 4,
                "files_per_node_per_step": files_per_node_per_step,
                "max_files_in_flight": max_files_in_flight,
            },
            shardcast={"port": origin_port},
            **({"p2p": {"port": 0}} if p2p else {}),
            pool={"id": pool_id, "deployment": "deployment.json"},
        )
    )
    return path
