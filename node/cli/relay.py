"""`prime-node origin`, `prime-node relay` and `prime-node fetch-weights`: SHARDCAST from the command line.

The origin serves the trainer's checkpoints, signed; relays mirror them from upstream servers and serve
them on; fetch-weights downloads a version from several servers at once and checks the trainer's signature.
The signing domain (chain id and ComputePool address) comes from the deployment file; no chain is contacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ledger.cli.common import (
    DEFAULT_DEPLOYMENT,
    CommandError,
    DeploymentOption,
    DevKeyOption,
    KeystoreOption,
    cli_errors,
    configure_daemon_logging,
    parse_address,
    require_signer,
    stderr_console,
    stdout_console,
)
from shardcast import trace
from shardcast.delta import DeltaPolicy
from shardcast.manifest import DEFAULT_SHARD_SIZE, FORMAT_VERSION, FORMATS
from shardcast.store import RELAY_MEMORY_MIB

if TYPE_CHECKING:
    from protocol.signing import SigningDomain
    from shardcast.server import ServerLimits

relay_app = typer.Typer()

DataOption = Annotated[Path, typer.Option("--data", metavar="DIR", help="Directory of the versions this server holds.")]
PortOption = Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port to listen on (0: any free one).")]
HostOption = Annotated[str, typer.Option("--host", help="Address to listen on; 0.0.0.0 for every interface.")]
KeepOption = Annotated[int, typer.Option("--keep", min=1, metavar="N", help="Versions kept; older ones are deleted.")]
MaxConnectionsOption = Annotated[
    int, typer.Option("--max-connections", min=1, metavar="N", help="Requests served at once, all clients together.")
]
MaxPerClientOption = Annotated[
    int, typer.Option("--max-per-client", min=1, metavar="N", help="Requests served at once to one client address.")
]
ClientRateOption = Annotated[
    float, typer.Option("--client-rate", min=0, metavar="MB/S", help="Bytes/s to one client address (0: no limit).")
]


def _domain(deployment: Path) -> SigningDomain:
    from ledger.deployment import Deployment
    from protocol.signing import SigningDomain

    loaded = Deployment.load(deployment)
    return SigningDomain(loaded.chain_id, loaded.address("ComputePool"))


def _limits(max_connections: int, max_per_client: int, client_rate: float) -> ServerLimits:
    from shardcast.server import ServerLimits

    return ServerLimits(
        max_connections=max_connections, max_per_client=max_per_client, client_rate=client_rate * 1_000_000
    )


def _freeze_heap() -> None:
    """Move everything imported so far (web3, eth_account, pydantic: about 90,000 objects) out of the garbage
    collector's reach. Collections then scan only what the transfer itself allocates; a profile of a 512 MiB
    download showed the collector walking the import-time heap for several percent of the receiver's CPU."""
    gc.collect()
    gc.freeze()


def _run_until_signal(main: Coroutine[Any, Any, None]) -> None:
    """Run a server coroutine until SIGINT or SIGTERM, then let it clean up."""
    _freeze_heap()

    async def runner() -> None:
        task = asyncio.create_task(main)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(runner())


@relay_app.command()
def origin(
    data: DataOption,
    watch: Annotated[
        Path, typer.Option("--watch", metavar="DIR", help="Folder whose new step_<N>/ checkpoints are published.")
    ],
    pool: Annotated[int, typer.Option("--pool", min=0, metavar="ID", help="Pool the checkpoints belong to.")],
    port: PortOption = 8700,
    host: HostOption = "127.0.0.1",
    keep: KeepOption = 3,
    shard_size: Annotated[
        int, typer.Option("--shard-size", min=1024, max=1024**3, metavar="BYTES", help="Shard size.")
    ] = DEFAULT_SHARD_SIZE,
    manifest_format: Annotated[
        int,
        typer.Option(
            "--manifest-format",
            min=min(FORMATS),
            max=max(FORMATS),
            metavar="N",
            help="Manifest format to sign: 3 adds deltas, 2 BLAKE3 shard hashes; older while older nodes remain.",
        ),
    ] = FORMAT_VERSION,
    delta: Annotated[
        bool,
        typer.Option(
            "--delta/--no-delta", help="Publish each step also as a delta against the step before (format 3)."
        ),
    ] = True,
    delta_min_mib: Annotated[
        int,
        typer.Option(
            "--delta-min-mib", min=0, metavar="MIB", help="Checkpoints smaller than this are sent whole only."
        ),
    ] = DeltaPolicy.min_bytes >> 20,
    deployment: DeploymentOption = DEFAULT_DEPLOYMENT,
    keystore: KeystoreOption = None,
    dev_key: DevKeyOption = None,
    max_connections: MaxConnectionsOption = 256,
    max_per_client: MaxPerClientOption = 32,
    client_rate: ClientRateOption = 0.0,
) -> None:
    """Serve signed checkpoints: publish every step_<N>/ directory that appears in --watch (rename it in)."""
    with cli_errors():
        configure_daemon_logging()
        trace.set_role("origin")
        domain = _domain(deployment)
        account = require_signer(keystore, dev_key, chain_id=domain.chain_id)
        if not watch.is_dir():
            raise CommandError(f"--watch {watch} is not a directory")
        limits = _limits(max_connections, max_per_client, client_rate)
        from shardcast.origin import Origin
        from shardcast.server import ShardServer
        from shardcast.store import ShardStore

        async def main() -> None:
            server = ShardServer(ShardStore(data), role="origin", limits=limits)
            bound = await server.start(host, port)
            stderr_console().print(f"origin of pool {pool} on http://{host}:{bound}, trainer {account.address}")
            source = Origin(
                server,
                account=account,
                domain=domain,
                pool_id=pool,
                keep=keep,
                shard_size=shard_size,
                manifest_format=manifest_format,
                delta=DeltaPolicy(min_bytes=delta_min_mib << 20) if delta else None,
            )
            try:
                await source.watch(watch)
            finally:
                await server.stop()

        _run_until_signal(main())


@relay_app.command()
def relay(
    data: DataOption,
    upstream: Annotated[
        list[str], typer.Option("--upstream", metavar="URL", help="Origin or relay to mirror from (repeatable).")
    ],
    port: PortOption = 8701,
    host: HostOption = "127.0.0.1",
    keep: KeepOption = 3,
    trainer: Annotated[
        str | None,
        typer.Option("--trainer", metavar="ADDR", help="Mirror only versions this trainer signed (recommended)."),
    ] = None,
    deployment: DeploymentOption = DEFAULT_DEPLOYMENT,
    parallel: Annotated[int, typer.Option("--parallel", min=1, max=64, help="Shards fetched at once.")] = 8,
    max_connections: MaxConnectionsOption = 256,
    max_per_client: MaxPerClientOption = 32,
    client_rate: ClientRateOption = 0.0,
    memory_mib: Annotated[
        int,
        typer.Option(
            "--memory-mib",
            min=0,
            metavar="MIB",
            help="Verified shards held in memory and served from there until the version is written to disk "
            "(0: write each shard as it arrives).",
        ),
    ] = RELAY_MEMORY_MIB,
    memory_when: Annotated[
        str,
        typer.Option(
            "--memory-when",
            metavar="pressed|always",
            help="Hold shards in memory only while the page cache is near the kernel's writeback threshold "
            "(pressed), or always (a relay that knows its disk is slow).",
        ),
    ] = "pressed",
) -> None:
    """Mirror checkpoints from upstream servers and serve them, each shard verified before it is served."""
    with cli_errors():
        configure_daemon_logging()
        trace.set_role("relay")
        policy = None
        if trainer is not None:
            from shardcast.trust import TrustPolicy

            policy = TrustPolicy(_domain(deployment), parse_address(trainer, what="--trainer"))
        limits = _limits(max_connections, max_per_client, client_rate)
        if memory_when not in ("pressed", "always"):
            raise CommandError(f"--memory-when must be pressed or always, got {memory_when!r}")
        from shardcast.fileio import page_cache_pressed
        from shardcast.mirror import Mirror
        from shardcast.server import ShardServer
        from shardcast.store import ShardStore

        hold = page_cache_pressed if memory_when == "pressed" else (lambda size: True)

        async def main() -> None:
            store = ShardStore(data, memory_bytes=memory_mib << 20, hold=hold)
            server = ShardServer(store, role="relay", limits=limits)
            mirror = Mirror(server, upstream, policy=policy, keep=keep, parallel=parallel)
            bound = await server.start(host, port)
            trust = f"trainer {policy.trainer}" if policy else "no --trainer: clients check signatures"
            stderr_console().print(f"relay on http://{host}:{bound}, mirroring {', '.join(upstream)} ({trust})")
            try:
                await mirror.run()
            finally:
                await server.stop()

        _run_until_signal(main())


def _parse_step(text: str) -> int | None:
    if text == "latest":
        return None
    if not text.isdigit():
        raise CommandError(f"--step must be 'latest' or a step number, got {text!r}")
    return int(text)


@relay_app.command("fetch-weights")
def fetch_weights(
    source: Annotated[list[str], typer.Option("--source", metavar="URL", help="Relay or origin (repeatable).")],
    trainer: Annotated[str, typer.Option("--trainer", metavar="ADDR", help="Address that must sign the manifest.")],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="The checkpoint lands in DIR/step_<N>/.")],
    step: Annotated[str, typer.Option("--step", metavar="latest|N", help="Which version.")] = "latest",
    pool: Annotated[
        int | None, typer.Option("--pool", min=0, metavar="ID", help="Refuse a manifest of another pool.")
    ] = None,
    after: Annotated[
        int | None,
        typer.Option("--after", min=0, metavar="N", help="Wait for a version newer than N, then fetch the newest."),
    ] = None,
    wait: Annotated[float, typer.Option("--wait", min=0, metavar="S", help="Longest wait for --after.")] = 3600.0,
    deployment: DeploymentOption = DEFAULT_DEPLOYMENT,
    parallel: Annotated[int, typer.Option("--parallel", min=1, max=64, help="Shards fetched at once.")] = 8,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    delta: Annotated[
        bool,
        typer.Option("--delta/--no-delta", help="Rebuild from a step held in --out when its deltas are fewer bytes."),
    ] = True,
) -> None:
    """Download a checkpoint from several servers at once, verify it, publish it atomically; print its path.

    A step whose manifest has a delta against a step already in --out is rebuilt from that step and the delta (or a
    chain of deltas), when that is fewer bytes; every rebuilt byte is checked against the trainer's hashes."""
    with cli_errors():
        configure_daemon_logging(logging.WARNING)  # a dropped source is worth a line; progress is the bar
        trace.set_role("client")
        wanted = _parse_step(step)
        if after is not None and wanted is not None:
            raise CommandError("--after waits for the newest version: use it with --step latest")
        from shardcast.trust import TrustPolicy

        policy = TrustPolicy(_domain(deployment), parse_address(trainer, what="--trainer"), pool)
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        from shardcast.client import FetchReport, fetch_checkpoint

        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        fetched: list[tuple[Any, int]] = []  # (manifest, bytes already there) once a download starts
        started_at = time.monotonic()
        with Progress(*columns, console=stderr_console(), transient=True, disable=quiet) as bar:
            task = bar.add_task("resolving", total=None)

            def started(manifest: Any, done: int) -> None:
                fetched.append((manifest, done))
                bar.update(task, description=f"step {manifest.step}", total=manifest.checkpoint_size, completed=done)

            _freeze_heap()
            report = FetchReport()
            path = asyncio.run(
                fetch_checkpoint(
                    source,
                    policy,
                    out,
                    step=wanted,
                    after=after,
                    wait=wait,
                    parallel=parallel,
                    on_start=started,
                    on_progress=lambda n: bar.advance(task, n),
                    delta=delta,
                    report=report,
                )
            )
        if not quiet:
            if fetched:
                manifest, resumed = fetched[0]
                seconds = time.monotonic() - started_at
                moved = (report.whole_bytes + report.delta_bytes) / 1e6
                note = f", {resumed / 1e6:,.1f} MB resumed from an earlier run" if resumed else ""
                if report.rebuilt_bytes:
                    links = "its delta" if report.links == 1 else f"a chain of {report.links} deltas"
                    note += (
                        f", {report.rebuilt_bytes / 1e6:,.1f} MB rebuilt from step {report.base_step} with {links}"
                        f" ({report.delta_bytes / 1e6:,.1f} MB)"
                    )
                stderr_console().print(
                    f"step {manifest.step}: {len(manifest.checkpoint_files)} files, {moved:,.1f} MB moved in"
                    f" {seconds:.2f} s ({moved / max(seconds, 1e-3):,.0f} MB/s){note}; every shard verified, signed"
                    f" by {policy.trainer}"
                )
            else:
                stderr_console().print(f"{path} is already here (published only after every shard verified)")
        stdout_console().print(str(path), soft_wrap=True)
        sys.stdout.flush()
