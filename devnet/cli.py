"""`prime-devnet`: a local chain with the contracts deployed, and the ledger lifecycle demo.

Thin commands: parse flags, call `ledger.chain` or `devnet.lifecycle`, print. Both pull in web3,
so they are imported inside each command and `prime-devnet --help` stays instant.
SIGINT and SIGTERM stop anvil before the command exits, so no chain is left behind.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ledger.cli.common import cli_errors

if TYPE_CHECKING:
    from devnet.lifecycle import LifecycleReport, Role
    from devnet.lifecycle import Snapshot as LifecycleSnapshot
    from devnet.network import DevnetReport, Snapshot
    from ledger.deployment import Deployment

app = typer.Typer(
    name="prime-devnet",
    no_args_is_help=True,
    help="Run the network on one machine: a local chain with the contracts, and scripted demos.",
)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _StopSignal:
    """While installed, SIGINT and SIGTERM only set a flag, so the command can stop anvil and exit 0."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> _StopSignal:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in _STOP_SIGNALS}
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)

    def wait(self, poll: float = 0.1) -> signal.Signals:
        # A sleep loop rather than Event.wait: a handler that touches a lock its own thread waits on can deadlock.
        while self.received is None:
            time.sleep(poll)
        return self.received


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt like Ctrl-C, so `finally` blocks stop anvil either way."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR, as servers set it: a port in TIME_WAIT is free, one with a listener is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _print_deployment_line(deployment: Deployment) -> None:
    """The deployment as one JSON line on stdout, flushed at once: scripts read it to find the chain."""
    sys.stdout.write(json.dumps(deployment.to_json()) + "\n")
    sys.stdout.flush()


@app.command()
def chain(
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help="Port for anvil (default: a free one)."),
    out: Path | None = typer.Option(None, "--out", help="Also write the deployment JSON to this file."),
    unbonding_period: int | None = typer.Option(
        None, "--unbonding-period", min=1, help="NodeRegistry unbonding period in seconds (default: 7 days)."
    ),
) -> None:
    """Start anvil, deploy the contracts, print the deployment as one JSON line, and run until Ctrl-C."""
    err = _stderr()
    with cli_errors(), _StopSignal() as stop:
        from ledger.accounts import DEV_KEY_LABEL
        from ledger.chain import LocalChain
        from ledger.deployment import DEFAULT_UNBONDING_PERIOD

        if port is not None and not _port_is_free(port):
            raise OSError(f"port {port} on 127.0.0.1 is in use: pick another with --port, or omit it for a free one")
        local = LocalChain(port=port)
        try:
            local.start()
            if stop.received is None:
                deployment = local.deploy(unbonding_period=unbonding_period or DEFAULT_UNBONDING_PERIOD)
                if out is not None:
                    deployment.save(out)  # before the stdout line, so a reader of the line finds the file
                _print_deployment_line(deployment)
                err.print(f"anvil on {local.rpc_url}, chain id {local.chain_id}; contracts deployed by account 0")
                err.print(Text(f"its accounts 0-9 are {DEV_KEY_LABEL}", style="yellow"))
                if out is not None:
                    err.print(f"deployment written to {out}")
                err.print("Ctrl-C to stop")
            received = stop.wait()
        finally:
            local.stop()
        err.print(f"{received.name}: anvil stopped")


@app.command()
def lifecycle(
    keep_running: bool = typer.Option(
        False, "--keep-running", help="Leave the chain running after the demo, until Ctrl-C."
    ),
) -> None:
    """Walk the ledger through a pool's life: stake, work, a burned slash, claims paid and refused, locks released."""
    console = Console(highlight=False, soft_wrap=True)
    with cli_errors():
        from devnet.lifecycle import dev_key_cast, run_lifecycle
        from ledger.accounts import DEV_KEY_LABEL
        from ledger.chain import LocalChain

        console.print(Text(f"signing keys: {DEV_KEY_LABEL}", style="bold yellow"))
        for role, index, address in dev_key_cast():
            console.print(f"  {role:<11} key {index}  {address}")

        def on_step(number: int, text: str) -> None:
            console.print(f"{number:>2}. {text}")

        local = LocalChain()
        try:
            with _sigterm_interrupts():
                report = run_lifecycle(on_step, chain=local)
            _print_report(console, report)
            if keep_running:
                with _StopSignal() as stop:
                    err = _stderr()
                    err.print(f"chain left running at {local.rpc_url}; Ctrl-C to stop")
                    _print_deployment_line(report.deployment)
                    stop.wait()
        finally:
            local.stop()


def _print_report(console: Console, report: LifecycleReport) -> None:
    from devnet.lifecycle import Role

    tokens = report.tokens
    console.print(_holdings_table(report))
    console.print(_pool_table(report))
    registry = (report.before.holdings[Role.REGISTRY].balance, report.after.holdings[Role.REGISTRY].balance)
    console.print(
        f"provider 1 earned {tokens(report.claimed)}; provider 2 lost {tokens(report.slashed)} of stake, "
        f"taken from node 2's lock in pool #{report.pool_id} and burned: the NodeRegistry holds it for good "
        f"(burned {tokens(report.before.burned)} → {tokens(report.after.burned)}, its token balance "
        f"{tokens(registry[0])} → {tokens(registry[1])}); nobody's balance rose by it"
    )
    console.print(
        f"escrow = funded - claimed: {tokens(report.funded)} - {tokens(report.claimed)} = "
        f"{tokens(report.after.escrow)} (slashes are not credited to it)"
    )
    for node, release in report.releases.items():
        provider = "provider 1" if node == Role.NODE_1 else "provider 2"
        why = "left" if node == Role.NODE_1 else "ejected"
        before, after = release.provider_locked
        console.print(
            f"{node}'s lock: {why} at block time {release.ended_at}, held until {release.held_until}, released at "
            f"{release.released_at}: {provider} locked {tokens(before)} → {tokens(after)}"
        )


def _change(report: LifecycleReport, before: int, after: int) -> str:
    if before == after:
        return report.tokens(after)
    sign = "+" if after > before else "-"
    return f"{report.tokens(before)} → {report.tokens(after)} ({sign}{report.tokens(abs(after - before))})"


def _holdings_table(report: LifecycleReport) -> Table:
    from devnet.lifecycle import TABLE_PARTIES

    # nothing unbonds in the script: Holdings.unbonding stays 0, and the table fits 80 columns without it
    table = Table(
        "party", "token balance", "active stake", "locked", title="before → after (tokens)", title_justify="left"
    )
    for role in TABLE_PARTIES:
        before, after = report.before.holdings[role], report.after.holdings[role]
        table.add_row(
            str(role),
            _change(report, before.balance, after.balance),
            _change(report, before.active_stake, after.active_stake),
            _change(report, before.locked, after.locked),
        )
    return table


def _pool_table(report: LifecycleReport) -> Table:
    from devnet.lifecycle import NODES

    names = {address: str(role) for role, address in report.addresses.items()}

    def members(addresses: tuple[str, ...]) -> str:
        return ", ".join(names.get(address, address) for address in addresses) or "none"

    def lock(role: Role, snapshot: LifecycleSnapshot) -> str:
        held = snapshot.locks[role]
        if not held.open:
            return "none (released)"
        if held.member:
            return f"{report.tokens(held.amount)} (member)"
        return f"{report.tokens(held.amount)} until block time {held.release_at}"

    table = Table(f"pool #{report.pool_id}", "before", "after", title_justify="left")
    table.add_row("escrow", report.tokens(report.before.escrow), report.tokens(report.after.escrow))
    table.add_row("burned (NodeRegistry)", report.tokens(report.before.burned), report.tokens(report.after.burned))
    for role in NODES:
        table.add_row(f"{role}'s lock", lock(role, report.before), lock(role, report.after))
    table.add_row("members", members(report.before.members), members(report.after.members))
    return table


@app.command()
def up(
    workers: int = typer.Option(2, "--workers", min=1, max=4, help="Worker processes, each its own node and provider."),
    cheater: bool = typer.Option(False, "--cheater", help="One worker fakes its rewards: it is slashed and ejected."),
    steps: int = typer.Option(120, "--steps", min=1, help="RL steps the trainer runs before the devnet stops."),
    folder: Path | None = typer.Option(
        None, "--dir", help="Run folder for logs, state and the report (default: runs/devnet-<time>)."
    ),
    model: Path | None = typer.Option(None, "--model", help="Start from this model instead of the warm-start one."),
    sft_steps: int = typer.Option(600, "--sft-steps", min=0, help="SFT steps of the warm-start model (0: random)."),
    rollouts_per_step: int = typer.Option(256, "--rollouts-per-step", min=1, help="Completions per RL step."),
    prompts_per_task: int = typer.Option(16, "--prompts-per-task", min=1, help="Problems in one assigned file."),
    group_size: int = typer.Option(8, "--group-size", min=2, help="Completions per problem (a GRPO group)."),
    eval_problems: int = typer.Option(256, "--eval-problems", min=1, help="Held-out problems for the pass rate."),
    eval_samples: int = typer.Option(4, "--eval-samples", min=1, help="Samples per held-out problem."),
    backend: str = typer.Option(
        "auto", "--backend", metavar="auto|vllm|torch", help="The workers' engine (auto: vLLM when installed)."
    ),
    band: tuple[float, float] = typer.Option(
        (0.1, 0.9),
        "--band",
        metavar="MIN MAX",
        help="RL draws only the problems whose pass rate under the starting model lies in [MIN, MAX] (0 1: all).",
    ),
) -> None:
    """Run the whole network here: chain, pool, trainer, relay, validator and workers, N RL steps, then a report."""
    console = Console(highlight=False, soft_wrap=True)
    with cli_errors():
        from devnet.network import DevnetSettings, run_devnet
        from engine.inference.select import choose

        root = folder or Path("runs") / time.strftime("devnet-%Y%m%d-%H%M%S")
        settings = DevnetSettings(
            root=root,
            workers=workers,
            cheater=cheater,
            steps=steps,
            model=model,
            sft_steps=sft_steps,
            rollouts_per_step=rollouts_per_step,
            prompts_per_task=prompts_per_task,
            group_size=group_size,
            eval_problems=eval_problems,
            eval_samples=eval_samples,
            backend=backend,
            band=band,
        )
        engine = choose(backend, "cpu").describe()  # refused here, before anything starts, if it cannot run
        console.print(f"prime-devnet up: {workers} workers{' (one cheats)' if cheater else ''}, {steps} RL steps")
        console.print(f"workers generate with {engine}")
        console.print(f"run folder: {settings.root.resolve()} (every process logs to logs/)")
        live = _LiveSummary(console)
        with _sigterm_interrupts(), live:
            report = run_devnet(settings, live.phase, live.update)
        _print_devnet_report(console, report)


class _LiveSummary:
    """Phases as lines; snapshots as a table redrawn in place on a terminal, or a line per new step otherwise."""

    def __init__(self, console: Console) -> None:
        from rich.live import Live

        self.console = console
        self.live = Live(console=console, auto_refresh=False, transient=True) if console.is_terminal else None
        self._printed_step = -1
        self._printed_at = 0.0

    def __enter__(self) -> _LiveSummary:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def phase(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")

    def update(self, snapshot: Snapshot) -> None:
        if self.live is not None:
            self.live.update(_snapshot_table(snapshot), refresh=True)
            return
        now = time.monotonic()
        if snapshot.step != self._printed_step and (now - self._printed_at >= 5 or snapshot.step == snapshot.steps):
            self._printed_step, self._printed_at = snapshot.step, now
            self.console.print(_snapshot_line(snapshot))


def _tokens(amount: int) -> str:
    from ledger.units import format_amount

    return format_amount(amount, 18, places=2)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _snapshot_line(s: Snapshot) -> str:
    rejected = sum(s.rejected.values())
    nodes = "; ".join(
        f"{n.name} {'ejected' if n.ejected else 'member' if n.member else 'joining'} stake {_tokens(n.stake)}"
        f" lock {_tokens(n.lock)}"
        for n in s.nodes
    )
    return (
        f"step {s.step}/{s.steps} ({s.seconds:.0f} s): reward {_rate(s.reward_mean)}, batch pass rate "
        f"{_rate(s.pass_rate)}; files submitted {s.submitted}, accepted {s.accepted}, rejected {rejected}, "
        f"trained {s.trained_files}; {nodes}"
    )


def _snapshot_table(s: Snapshot) -> Table:
    table = Table(
        "node", "role", "pool", "files", "invalidated", "slashed (burned)", "lock", "provider stake",
        title_justify="left",
        title=(
            f"step {s.step}/{s.steps}  {s.seconds:.0f} s  reward {_rate(s.reward_mean)}  batch pass rate "
            f"{_rate(s.pass_rate)}  files: submitted {s.submitted}, accepted {s.accepted}, rejected "
            f"{sum(s.rejected.values())}, trained {s.trained_files}"
        ),
    )  # fmt: skip
    for n in s.nodes:
        pool = "ejected" if n.ejected else "member" if n.member else "joining"
        table.add_row(
            f"{n.name} {n.address[:10]}…",
            "cheater" if n.cheater else "honest",
            f"{pool} ({n.process})",
            str(n.submitted),
            str(n.invalidated),
            _tokens(n.slashed),
            _tokens(n.lock),
            _tokens(n.stake),
        )
    return table


def _print_devnet_report(console: Console, report: DevnetReport) -> None:
    console.print()
    console.print(Text("devnet report", style="bold"))
    idle = f"trainer idle {report.idle_seconds:.0f} s waiting for accepted files"
    console.print(f"  RL steps        {report.steps} in {report.seconds:.0f} s ({idle})")
    console.print(
        f"  pass rate       {report.pass_rate_before:.1%} → {report.pass_rate_after:.1%} "
        f"({report.change_points:+.1f} points; {report.eval_problems} held-out problems x {report.eval_samples})"
    )
    reasons = ", ".join(f"{n} {label}" for label, n in report.rejected.items()) or "none"
    rejected = sum(report.rejected.values())
    console.print(
        f"  files           submitted {report.submitted}, accepted {report.accepted}, rejected {rejected} ({reasons}),"
        f" trained on {report.trained_files}, not judged when the validator stopped {report.unverified}"
    )
    table = Table(
        "node", "role", "files", "invalidated", "pool", "lock", "provider stake", "claimed", title_justify="left"
    )
    for n in report.nodes:
        before = report.stake_before.get(n.provider, n.stake)
        stake = _tokens(n.stake) if before == n.stake else f"{_tokens(before)} → {_tokens(n.stake)}"
        lock = _tokens(n.lock) + (f" until block time {n.lock_release_at}" if n.lock and n.lock_release_at else "")
        table.add_row(
            f"{n.name} {n.address}",
            "cheater" if n.cheater else "honest",
            str(n.submitted),
            str(n.invalidated),
            "ejected" if n.ejected else "member" if n.member else "-",
            lock,
            stake,
            _tokens(report.claimed.get(n.provider, 0)),
        )
    console.print(table)
    for line in _slash_lines(report):
        console.print(line)
    if report.plot is not None:
        console.print(f"  reward curve    {report.plot}")
    console.print(f"  logs            {report.logs}")
    console.print(f"  report          {report.root / 'report.json'}")


def _slash_lines(report: DevnetReport) -> list[str]:
    """Where the slashed tokens went (burned, in the registry), each slashed node's amount, and the escrow."""
    names = {n.address: n.name for n in report.nodes}
    invalidated = {n.address: n.invalidated for n in report.nodes}
    lines = []
    for node, amount in report.slashed.items():
        void = report.void.get(node, 0)
        lines.append(
            f"  slashed         {names.get(node, node)} {node}: {_tokens(amount)} tokens burned from its lock "
            f"({invalidated.get(node, 0)} invalidations"
            + (f"; its {void} other pending files are void: ejected, never paid)" if void else ")")
        )
    lines.append(
        f"  burned          {_tokens(report.burned)} tokens in all (NodeRegistry.burned): the registry keeps them,"
        " nobody is paid them"
    )
    claimed = sum(report.claimed.values())
    lines.append(
        f"  escrow          {_tokens(report.funded)} funded - {_tokens(claimed)} claimed = {_tokens(report.escrow)}"
        " (slashes are not credited to it)"
    )
    return lines


if __name__ == "__main__":
    app()
