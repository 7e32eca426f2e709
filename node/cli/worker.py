"""`prime-node register|join|leave|unstake|withdraw|claim|status`: a provider's and a node's life on chain.

The provider key holds the stake and is paid; the node key joins pools and submits work (it may be the same
key). Thin commands: validate flags, call `ledger.client.Ledger`, print. web3 loads inside each command
body, so `prime-node --help` stays instant.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ledger.cli.common import (
    NODE_PASSWORD_ENV_VAR,
    ChainFlags,
    CommandError,
    KeyFlags,
    chain_flags,
    check_key_flags,
    cli_errors,
    format_duration,
    format_time,
    format_tokens,
    load_signer,
    parse_address,
    parse_bytes32,
    parse_tokens,
    stdout_console,
)
from ledger.errors import ContractRevert
from ledger.types import BatchStatus, Ejection, Reason
from node.cli.batch_records import provider_batches
from protocol.terms import batch_state, challenge_closes_at

if TYPE_CHECKING:
    from ledger.client import Ledger
    from ledger.events import BatchInvalidated
    from node.daemon.state import JournalView

worker_app = typer.Typer(help="Stake, bind nodes, join pools and claim rewards.")

NODE_FLAGS = KeyFlags("--node-keystore", "--node-dev-key", password_env=NODE_PASSWORD_ENV_VAR)
PoolArgument = Annotated[int, typer.Argument(min=1, metavar="POOL", help="Pool id.")]
TokensArgument = Annotated[str, typer.Argument(metavar="TOKENS", help="Whole tokens, e.g. 100 or 0.5.")]
NodeKeystoreOption = Annotated[
    Path | None,
    typer.Option(
        "--node-keystore",
        metavar="FILE",
        help="The node's keystore (default: the provider's key); password from "
        f"{NODE_PASSWORD_ENV_VAR}, else PRIME_KEYSTORE_PASSWORD, else a prompt.",
    ),
]
NodeDevKeyOption = Annotated[
    int | None,
    typer.Option("--node-dev-key", min=0, max=9, metavar="M", help="The node is anvil development key M."),
]


@worker_app.command()
@chain_flags()
def register(
    chain: ChainFlags,
    stake: Annotated[str, typer.Option(metavar="TOKENS", help="Tokens to add to the provider's stake (0: none).")],
    node_keystore: NodeKeystoreOption = None,
    node_dev_key: NodeDevKeyOption = None,
) -> None:
    """Stake as the provider (--keystore/--dev-key) and bind a node to it; safe to run again."""
    with cli_errors():
        check_key_flags(node_keystore, node_dev_key, required=False, flags=NODE_FLAGS)
        ledger = chain.open_ledger()
        amount = parse_tokens(stake, ledger.decimals, what="--stake")
        node = load_signer(node_keystore, node_dev_key, chain_id=ledger.deployment.chain_id, flags=NODE_FLAGS)
        node = node or ledger.account
        assert node is not None  # open_ledger(need_signer=True) gave the ledger an account
        provider = ledger.address
        console = stdout_console()
        if amount:
            balance = ledger.balance_of(provider)
            if balance < amount:
                held = format_tokens(balance, ledger.decimals)
                raise CommandError(f"--stake {stake}: provider {provider} holds only {held} tokens")
            ledger.stake(amount)  # approves the registry first when the allowance is short
            console.print(f"staked {stake} tokens from {provider}")
        if ledger.provider_of(node.address) == provider and ledger.is_active_node(node.address):
            console.print(f"node {node.address} is already bound to provider {provider}")
        else:
            ledger.add_node(node)  # the node key signs the EIP-712 NodeBinding here
            console.print(f"bound node {node.address} to provider {provider}")
        info = ledger.stake_of(provider)
        console.print(f"active stake {format_tokens(info.active, ledger.decimals)} tokens")


@worker_app.command()
@chain_flags()
def join(chain: ChainFlags, pool: PoolArgument) -> None:
    """Join POOL as the node (--keystore/--dev-key is the NODE key); locks its provider's stake."""
    with cli_errors():
        ledger = chain.open_ledger()
        ledger.join(pool)
        config = ledger.pool(pool).config
        locked = format_tokens(config.min_stake_per_node, ledger.decimals)
        stdout_console().print(
            f"node {ledger.address} joined pool {pool} {config.name!r}; {locked} tokens of "
            f"provider {ledger.provider_of(ledger.address)}'s stake are locked in this pool while it stays "
            "and one challenge window after it leaves"
        )


@worker_app.command()
@chain_flags()
def leave(chain: ChainFlags, pool: PoolArgument) -> None:
    """Leave POOL as the node (--keystore/--dev-key is the NODE key).

    The provider's stake stays locked one challenge window longer, until the last submitted work's window has
    closed; `prime-node release POOL` frees it then.
    """
    with cli_errors():
        ledger = chain.open_ledger()
        ledger.leave(pool)
        lock = ledger.lock_of(pool, ledger.address)
        stdout_console().print(
            f"node {ledger.address} left pool {pool}; {format_tokens(lock.amount, ledger.decimals)} tokens stay "
            f"locked until {format_time(lock.release_at)} (the last challenge window), then `prime-node release {pool}`"
        )


@worker_app.command()
@chain_flags()
def release(
    chain: ChainFlags,
    pool: PoolArgument,
    node: Annotated[
        list[str] | None,
        typer.Option("--node", metavar="ADDR", help="Release this node's lock (repeat); default: every node's."),
    ] = None,
) -> None:
    """Free the stake locked in POOL by nodes that left it (or were ejected) once their challenge window closed.

    Sign with any key (the provider's, a node's): the stake stays the provider's, it only stops being locked.
    """
    with cli_errors():
        ledger = chain.open_ledger()
        provider = ledger.provider_of(ledger.address) or ledger.address
        nodes = [parse_address(n, what="--node") for n in node] if node else ledger.nodes_of(provider)
        now, console, released = ledger.timestamp(), stdout_console(), 0
        if not nodes:
            console.print(f"provider {provider} has no nodes; nothing is locked for it in pool {pool}")
        for address in nodes:
            lock = ledger.lock_of(pool, address)
            amount = format_tokens(lock.amount, ledger.decimals)
            if not lock.open:
                console.print(f"node {address}: no lock in pool {pool}")
            elif lock.member:
                console.print(f"node {address}: a member of pool {pool}; its {amount} tokens stay locked (leave first)")
            elif not lock.releasable(now):
                console.print(f"node {address}: {amount} tokens locked until {format_time(lock.release_at)}")
            else:
                ledger.release_stake(pool, address)
                released += lock.amount
                console.print(f"node {address}: released {amount} tokens")
        if released:
            console.print(f"provider {provider}: {format_tokens(released, ledger.decimals)} tokens free again")


@worker_app.command()
@chain_flags()
def unstake(chain: ChainFlags, tokens: TokensArgument) -> None:
    """Start unbonding TOKENS of the provider's active stake; `withdraw` them after the unbonding period."""
    with cli_errors():
        ledger = chain.open_ledger()
        try:
            ledger.request_unstake(parse_tokens(tokens, ledger.decimals, what="TOKENS"))
        except ContractRevert as exc:
            if exc.name == "InsufficientActiveStake":
                held = ledger.stake_of(ledger.address)
                free, locked = (format_tokens(v, ledger.decimals) for v in (held.active - held.locked, held.locked))
                raise CommandError(
                    f"only {free} tokens of stake are free: pools lock {locked} (a node's lock is held until one "
                    "challenge window after it leaves; `prime-node status --pool N` shows when)"
                ) from exc
            raise
        info = ledger.stake_of(ledger.address)
        unbonding = format_tokens(info.unbonding, ledger.decimals)
        stdout_console().print(
            f"{unbonding} tokens unbonding; withdraw them after {format_time(info.release_at)} "
            "with `prime-node withdraw`"
        )


@worker_app.command()
@chain_flags()
def withdraw(chain: ChainFlags) -> None:
    """Withdraw the provider's unbonded stake once its unbonding period has passed."""
    with cli_errors():
        ledger = chain.open_ledger()
        info = ledger.stake_of(ledger.address)
        amount = format_tokens(info.unbonding, ledger.decimals)
        try:
            ledger.withdraw()
        except ContractRevert as exc:
            if exc.name == "StillUnbonding":
                release, now = int(exc.values["releaseAt"]), int(exc.values["timestamp"])
                raise CommandError(
                    f"{amount} tokens are still unbonding: released at {format_time(release)} "
                    f"(in {format_duration(release - now)}); withdraw then"
                ) from exc
            if exc.name == "NothingToWithdraw":
                raise CommandError(
                    f"nothing to withdraw: {ledger.address} has no unbonding stake; `prime-node unstake` first"
                ) from exc
            raise
        stdout_console().print(f"withdrew {amount} tokens to {ledger.address}")


@worker_app.command()
@chain_flags()
def claim(
    chain: ChainFlags,
    pool: PoolArgument,
    roots: Annotated[
        list[str] | None,
        typer.Option("--batch", metavar="ROOT", help="Claim these batches (repeat); default: every claimable one."),
    ] = None,
) -> None:
    """Claim rewards in POOL for the provider's batches whose challenge window has passed, one transaction per node.

    A batch is paid whole, less the leaves validators refused. Sign with the provider key or one of its node keys;
    the tokens always go to the provider.
    """
    with cli_errors():
        wanted = [parse_bytes32(root, what="--batch") for root in roots or []]
        ledger = chain.open_ledger()
        provider = ledger.provider_of(ledger.address) or ledger.address  # a node key claims for its provider
        console = stdout_console()
        window, now = ledger.challenge_window(pool), ledger.timestamp()
        batches = provider_batches(ledger, pool, provider)
        if wanted:
            found = [b for b in batches if b.root in set(wanted)]
            missing = set(wanted) - {b.root for b in found}
            if missing:
                shown = ", ".join("0x" + r.hex() for r in sorted(missing))
                raise CommandError(f"no batch of provider {provider}'s nodes in pool {pool} has root {shown}")
            chosen = [b for b in found if b.status == BatchStatus.PENDING]  # a root settled once may be sent again
            settled = {b.root: b.status for b in found if b.root not in {c.root for c in chosen}}
            if settled:
                shown = ", ".join(f"0x{r.hex()} is {s.name.lower()}" for r, s in settled.items())
                raise CommandError(f"batch {shown} already: nothing to claim")
        else:
            voided = {n: ledger.is_voided(pool, n) for n in {b.node for b in batches}}  # an owner's ejection: none
            pending = [b for b in batches if b.status == BatchStatus.PENDING and not voided[b.node]]
            chosen = [b for b in pending if batch_state(b, window, now) == "claimable"]
            if not chosen:
                if pending:
                    first = min(b.submitted_at for b in pending) + window
                    console.print(
                        f"nothing to claim yet: {len(pending)} pending batches in pool {pool} are still in their "
                        f"challenge window; the first closes at {format_time(first)}"
                    )
                else:
                    console.print(f"nothing to claim: provider {provider} has no claimable batch in pool {pool}")
                return
        from web3.logs import DISCARD

        by_node: dict[str, list[tuple[int, bytes]]] = {}
        for batch in chosen:
            by_node.setdefault(batch.node, []).append((batch.slot, batch.root))
        paid = 0
        for node, refs in by_node.items():  # one transaction per node: a batch belongs to its node, in its slot
            receipt = ledger.claim_batches(pool, node, [root for _, root in refs], slots=[slot for slot, _ in refs])
            events = ledger.work.events.BatchesClaimed().process_receipt(receipt, errors=DISCARD)
            paid += sum(int(event["args"]["amount"]) for event in events)
        files = sum(b.count for b in chosen)
        console.print(
            f"claimed {len(chosen)} batches ({files} files) in pool {pool}: {format_tokens(paid, ledger.decimals)} "
            f"tokens paid to {provider}"
        )


@worker_app.command()
@chain_flags()
def status(
    chain: ChainFlags,
    pool: Annotated[int | None, typer.Option(min=1, help="Also show memberships and work in this pool.")] = None,
    address: Annotated[
        str | None, typer.Option(metavar="ADDR", help="Provider or node to show (read-only; no key needed).")
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option(
            "--state",
            metavar="DIR",
            help="A worker's state folder: adds its journal (files and batches by stage, what validators attested).",
        ),
    ] = None,
) -> None:
    """Show a provider's (or a node's provider's) stake, balance, nodes, and batches in --pool."""
    with cli_errors():
        if address is None and chain.keystore is None and chain.dev_key is None:
            raise CommandError("say whose status: pass --address ADDR, or --keystore FILE / --dev-key N")
        if address is not None and (chain.keystore is not None or chain.dev_key is not None):
            raise CommandError("give --address or a key (--keystore/--dev-key), not both")
        target = parse_address(address, what="--address") if address is not None else None
        journal = None
        if state is not None:
            from node.daemon.state import read_journal

            journal = read_journal(state.expanduser())
        ledger = chain.open_ledger(need_signer=False)
        target = target or ledger.address
        _print_status(ledger, target, pool)
        if journal is not None:
            print_journal(journal, state_dir=state)


def _print_status(ledger: Ledger, target: str, pool: int | None) -> None:
    decimals = ledger.decimals

    def tokens(value: int) -> str:
        return f"{format_tokens(value, decimals)} tokens"

    provider = ledger.provider_of(target) or target  # a node shows its provider's stake
    info = ledger.stake_of(provider)
    rows = [("provider", provider)]
    if provider != target:
        rows.append(("asked about", f"{target}, a node of this provider"))
    rows += [
        ("token balance", tokens(ledger.balance_of(provider))),
        ("active stake", tokens(info.active)),
        ("locked by pools", tokens(info.locked)),
        ("unbonding", tokens(info.unbonding)),
    ]
    if info.unbonding:
        rows.append(("released at", format_time(info.release_at)))
    nodes = ledger.nodes_of(provider)
    for node in nodes:
        rows.append(("node", f"{node} {_membership(ledger, pool, node)}".rstrip()))
    if not nodes:
        rows.append(("nodes", "none bound; `prime-node register`"))
    table = Table(show_header=False, title=f"status of {target}", title_justify="left")
    for field, value in rows:
        table.add_row(field, value)
    console = stdout_console()
    console.print(table)
    if pool is not None:
        _print_batches(ledger, pool, provider, tokens)


def _membership(ledger: Ledger, pool: int | None, node: str) -> str:
    if pool is None:
        return ""
    lock = ledger.lock_of(pool, node)
    locked = format_tokens(lock.amount, ledger.decimals)
    if ledger.is_member(pool, node):
        return f"(member of pool {pool}, locking {locked} tokens)"
    ejection = ledger.ejection_of(pool, node)
    state = {
        Ejection.NONE: f"not in pool {pool}",
        Ejection.BY_OWNER: f"ejected from pool {pool} by its owner; earlier work is still paid unless invalidated",
        Ejection.BY_INVALIDATION: f"ejected from pool {pool} by an invalidation; its pending work is void",
    }[ejection]
    if lock.open:
        state += f"; {locked} tokens locked until {format_time(lock.release_at)}"
    return f"({state})"


def _print_batches(ledger: Ledger, pool: int, provider: str, tokens: Callable[[int], str]) -> None:
    config = ledger.pool(pool).config
    now, per_unit = ledger.timestamp(), config.reward_per_unit
    batches = provider_batches(ledger, pool, provider)
    from ledger.events import batch_invalidations, leaf_refusals

    invalidated = batch_invalidations(ledger, pool) if any(b.status == BatchStatus.INVALIDATED for b in batches) else {}
    refused = leaf_refusals(ledger, pool) if any(b.refused_units for b in batches) else {}
    voided = {n: ledger.is_voided(pool, n) for n in {b.node for b in batches}}
    table = Table(
        "batch", "files", "units", "submitted", "state", "reward", title=f"batches in pool {pool}", title_justify="left"
    )
    # "none": a submission the chain no longer holds (a reorganisation took it out as this was read)
    totals = {"pending": 0, "claimable": 0, "invalidated": 0, "claimed": 0, "void": 0, "none": 0, "refused": 0}
    for batch in batches:
        state = batch_state(batch, config.challenge_window, now, voided=voided[batch.node])
        paid = (batch.total_units if state == "invalidated" else batch.payable_units) * per_unit
        totals[state] += paid
        if state != "invalidated":
            totals["refused"] += batch.refused_units * per_unit
        shown = state
        if state == "pending":
            shown = f"pending until {format_time(challenge_closes_at(batch.submitted_at, config.challenge_window))}"
        elif state == "invalidated":
            shown = "invalidated: " + _invalidation_text(invalidated.get((batch.node, batch.root)), ledger.decimals)
        elif state == "void":
            shown = "void: its node was ejected from the pool by an invalidation"
        elif state == "none":
            shown = "not on chain (a reorganisation took it out?)"
        leaves = [e for (node, root, _), e in refused.items() if (node, root) == (batch.node, batch.root)]
        if batch.refused_units and state != "invalidated":
            why = ", ".join(sorted({Reason.label(e.reason) for e in leaves})) or "reason not found"
            count = len(leaves) or "some"
            shown += f"; refused leaves (never paid, not slashed): {count}, {batch.refused_units} units, {why}"
        table.add_row(
            "0x" + batch.root.hex()[:12] + "…",
            str(batch.count),
            str(batch.total_units),
            format_time(batch.submitted_at),
            shown,
            tokens(paid),
        )
    console = stdout_console()
    if batches:
        console.print(table)
    else:
        console.print(f"no batch submitted to pool {pool} by provider {provider}'s nodes")
    earned = totals["claimed"] + totals["claimable"]
    console.print(
        f"earned {tokens(earned)} (claimed {tokens(totals['claimed'])}, claimable {tokens(totals['claimable'])}); "
        f"at risk {tokens(totals['pending'])} in open challenge windows"
    )
    if totals["invalidated"] or totals["void"]:
        lost = totals["invalidated"] + totals["void"]
        console.print(f"lost {tokens(lost)} of rewards to invalidated batches and the void batches of ejected nodes")
    if totals["refused"]:
        console.print(f"refused {tokens(totals['refused'])} of rewards: borderline files, not paid and not slashed")


def _invalidation_text(event: BatchInvalidated | None, decimals: int) -> str:
    if event is None:
        return "reason not found"
    slashed = f"{Reason.label(event.reason)}, {format_tokens(event.slashed, decimals)} tokens slashed (burned)"
    if event.leaf_index is None or event.work_key is None:
        return f"no leaf list was made available: {slashed}"
    return f"leaf {event.leaf_index} (0x{event.work_key.hex()[:12]}…): {slashed}"


JOURNAL_FILES_SHOWN = 50  # newest files listed by `status --state`; the counts cover every file


def print_journal(journal: JournalView, *, state_dir: Path | None) -> None:
    """The worker's journal: files and batches by stage, then its newest files with their batch (and its slot) and
    what validators attested (or why they were not paid)."""
    console = stdout_console()

    def by_stage(counts: dict[str, int]) -> str:
        return ", ".join(f"{n} {stage}" for stage, n in counts.items() if n) or "none"

    console.print(
        f"journal {state_dir}: files {by_stage(journal.file_counts())}; batches {by_stage(journal.batch_counts())}"
    )
    shown = journal.files[-JOURNAL_FILES_SHOWN:]
    if not shown:
        return
    more = f" (newest {len(shown)} of {len(journal.files)})" if len(shown) < len(journal.files) else ""
    table = Table("file", "batch", "units", "stage", "validators attested / detail", title=f"files{more}",
                  title_justify="left")  # fmt: skip
    slots = {b.root: b.slot for b in journal.batches}
    for record in shown:
        batch = "-"
        if record.root is not None:
            slot = slots.get(record.root)
            batch = f"0x{record.root.hex()[:12]}… leaf {record.leaf_index}" + ("" if slot is None else f", slot {slot}")
        table.add_row(
            "0x" + record.work_key.hex()[:12] + "…",
            batch,
            str(record.units),
            record.stage,
            "; ".join(part for part in (record.verdict, record.detail) if part),
        )
    console.print(table)
