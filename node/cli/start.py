"""`prime-node start`: the worker daemon (node/daemon/worker.py) from flags, an optional node.toml, and the chain.

Where the pool's parts are (coordinator, checkpoint sources, task) comes from the pool spec at the pool's
`specURI` on chain (protocol/pool_spec.py); `--coordinator`, `--checkpoints` and `--task` override it, and are needed
for a pool without a spec. Flags override the config file (`configs/node.toml` documents every field), which
overrides the defaults; every setting is declared once, with its default and bounds, in `node.config.WorkerSettings`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from core.trace import configure_tracing
from ledger.cli.common import (
    DEFAULT_DEPLOYMENT,
    CommandError,
    DeploymentOption,
    DevKeyOption,
    KeyFlags,
    KeystoreOption,
    MemoryBudgetOption,
    RpcUrlOption,
    check_key_flags,
    cli_errors,
    configure_daemon_logging,
    load_signer,
    open_ledger,
    parse_tokens,
)
from node.cli.inference import BackendOption, DeviceOption

if TYPE_CHECKING:
    from ledger.client import Ledger
    from node.config import WorkerSettings

start_app = typer.Typer()

DEFAULT_DASHBOARD_PORT = 8790  # `--dashboard` without a port from a flag or the config

PROVIDER_FLAGS = KeyFlags("--provider-keystore", "--provider-dev-key", password_env="PRIME_PROVIDER_KEYSTORE_PASSWORD")


def _register(node_ledger: Ledger, keystore: Path | None, dev_key: int | None, stake: str | None) -> None:
    """As the provider: add `stake` tokens, then bind the node (the node key signs the binding). Safe to repeat."""
    node = node_ledger.account
    assert node is not None
    check_key_flags(keystore, dev_key, required=True, flags=PROVIDER_FLAGS)
    provider = load_signer(keystore, dev_key, chain_id=node_ledger.deployment.chain_id, flags=PROVIDER_FLAGS)
    assert provider is not None
    ledger = node_ledger.as_account(provider)
    amount = parse_tokens(stake, ledger.decimals, what="--stake") if stake is not None else 0
    if amount:
        ledger.stake(amount)  # approves the registry first when the allowance is short
    bound = ledger.provider_of(node.address)
    if bound is not None and bound != provider.address:
        raise CommandError(f"node {node.address} is bound to another provider, {bound}")
    if bound is None:
        ledger.add_node(node)


def _dashboard_port(enabled: bool | None, port: int | None, config: WorkerSettings) -> int | None:
    """None (no dashboard) unless --dashboard, --dashboard-port or the config's dashboard_port asks for one;
    `port` is the flag, `config.dashboard_port` the flag or else the file's."""
    if enabled is False:
        if port is not None:
            raise CommandError("--no-dashboard and --dashboard-port do not go together")
        return None
    if config.dashboard_port is None and enabled:
        return DEFAULT_DASHBOARD_PORT
    return config.dashboard_port


@start_app.command()
def start(
    pool: Annotated[int, typer.Option("--pool", min=1, metavar="N", help="The pool to work for.")],
    keystore: KeystoreOption = None,
    dev_key: DevKeyOption = None,
    config_file: Annotated[Path | None, typer.Option("--config", metavar="FILE", help="node.toml ([worker]).")] = None,
    deployment: DeploymentOption = DEFAULT_DEPLOYMENT,
    rpc_url: RpcUrlOption = None,
    state: Annotated[
        Path | None, typer.Option("--state", metavar="DIR", help="Journal, files and weights (restart-safe).")
    ] = None,
    coordinator: Annotated[str | None, typer.Option(metavar="URL", help="Override the pool spec's.")] = None,
    checkpoints: Annotated[
        list[str] | None, typer.Option("--checkpoints", metavar="URL", help="Checkpoint source (repeat).")
    ] = None,
    task: Annotated[Path | None, typer.Option(metavar="SPEC", help="Task spec; overrides the pool spec's.")] = None,
    join: Annotated[bool | None, typer.Option("--join/--no-join", help="Join the pool if not a member.")] = None,
    claim: Annotated[bool | None, typer.Option("--claim/--no-claim", help="Claim matured rewards.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences decoded together.")] = None,
    backend: Annotated[str | None, BackendOption] = None,
    device: Annotated[str | None, DeviceOption] = None,
    threads: Annotated[int | None, typer.Option(help="torch threads (0: torch's default).")] = None,
    submit_batch: Annotated[int | None, typer.Option(help="Files per batch (one Merkle root per submitBatch).")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve /metrics (0: any port).")] = None,
    max_files: Annotated[
        int | None,
        typer.Option(help="Stop after this many files (0: make none; upload, submit and check the journal's)."),
    ] = None,
    dashboard: Annotated[
        bool | None,
        typer.Option(
            "--dashboard/--no-dashboard",
            help=f"Serve the web dashboard on 127.0.0.1 (default: when the config sets dashboard_port; "
            f"port {DEFAULT_DASHBOARD_PORT} unless given).",
        ),
    ] = None,
    dashboard_port: Annotated[
        int | None,
        typer.Option(metavar="P", help="The dashboard's port (0: any free one); implies --dashboard."),
    ] = None,
    relay: Annotated[bool, typer.Option("--relay", help="Also serve the checkpoints this node holds.")] = False,
    relay_port: Annotated[int | None, typer.Option(help="The relay's port (0: any free one); implies --relay.")] = None,
    relay_host: Annotated[
        str | None, typer.Option(help="The relay's address (default 127.0.0.1); 0.0.0.0 to serve other machines.")
    ] = None,
    p2p_port: Annotated[
        int | None,
        typer.Option(metavar="P", help="Join the pool's gossip on this port (0: any free one)."),
    ] = None,
    register: Annotated[
        bool, typer.Option("--register", help="Bind this node to the provider first (needs the provider's key).")
    ] = False,
    provider_keystore: Annotated[
        Path | None,
        typer.Option(
            "--provider-keystore",
            metavar="FILE",
            help="The provider's keystore, for --register (password: PRIME_PROVIDER_KEYSTORE_PASSWORD).",
        ),
    ] = None,
    provider_dev_key: Annotated[
        int | None, typer.Option("--provider-dev-key", min=0, max=9, metavar="M", help="Anvil key M as the provider.")
    ] = None,
    stake: Annotated[
        str | None,
        typer.Option("--stake", metavar="TOKENS", help="With --register: tokens the provider adds to its stake."),
    ] = None,
    simulate_fault: Annotated[
        str | None,
        typer.Option(
            metavar="FAULT",
            help="Cheat on purpose (local devnets only): wrong-model|tamper-tokens|fake-reward|stale-step",
        ),
    ] = None,
    memory_budget: MemoryBudgetOption = None,
) -> None:
    """Work for pool N: fetch the newest policy, generate rollouts with proofs, upload them, submit them on chain."""
    configure_daemon_logging()
    configure_tracing("worker")
    with cli_errors():
        import asyncio

        from core.hostmemory import parse_size
        from core.signals import run_until_signalled
        from node.config import WorkerSettings
        from node.daemon.chain import LedgerWorkChain
        from node.daemon.faults import FaultyWorker, check_fault_allowed, parse_fault
        from node.daemon.worker import WorkerDaemon
        from node.dashboard.worker import worker_dashboard

        config = WorkerSettings.load(
            config_file,
            flags={
                "state": state,
                "coordinator": coordinator,
                "checkpoints": checkpoints,
                "task": task,
                "join": join,
                "claim": claim,
                "batch_size": batch_size,
                "backend": backend,
                "device": device,
                "threads": threads,
                "submit_batch": submit_batch,
                "metrics_port": metrics_port,
                "max_files": max_files,
                "dashboard_port": dashboard_port,
                "relay_port": 0 if relay and relay_port is None else relay_port,
                "relay_host": relay_host,
                "p2p_port": p2p_port,
            },
        )
        config = replace(config, dashboard_port=_dashboard_port(dashboard, dashboard_port, config))
        budget = parse_size(memory_budget) if memory_budget is not None else None
        fault = parse_fault(simulate_fault)
        ledger = open_ledger(deployment, rpc_url, keystore, dev_key)
        if fault is not None:
            check_fault_allowed(fault, chain_id=ledger.deployment.chain_id, rpc_url=ledger.deployment.rpc_url)
        account = ledger.account
        assert account is not None  # open_ledger requires a signer
        if register:
            _register(ledger, provider_keystore, provider_dev_key, stake)
        elif provider_keystore is not None or provider_dev_key is not None or stake is not None:
            raise CommandError("--provider-keystore, --provider-dev-key and --stake go with --register")
        joined = config.resolve(ledger.pool(pool))
        if config.threads:
            import torch

            torch.set_num_threads(config.threads)

        async def main() -> int:
            chain = LedgerWorkChain(ledger)
            serve = worker_dashboard(ledger)
            daemon = (
                WorkerDaemon(config, joined, chain, account, dashboard=serve, memory_budget=budget)
                if fault is None  # a cheater is the same daemon with its honest hooks replaced (node.daemon.faults)
                else FaultyWorker(config, joined, chain, account, fault, dashboard=serve, memory_budget=budget)
            )
            return await run_until_signalled(daemon)

        code = asyncio.run(main())
    raise typer.Exit(code)
