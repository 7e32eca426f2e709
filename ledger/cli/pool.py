"""`prime-pool`: deploy the contracts, create and fund pools, appoint validators, inspect a pool.

Thin commands: validate flags, call `ledger.client.Ledger`, print. Amounts are typed in whole tokens and
converted with the token's decimals. web3 loads inside each command body, so `prime-pool --help` is instant.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ledger.cli.common import (
    DEFAULT_DEPLOYMENT,
    ChainFlags,
    CommandError,
    DevKeyOption,
    JsonOption,
    KeystoreOption,
    chain_flags,
    check_key_flags,
    cli_errors,
    command_app,
    format_duration,
    format_tokens,
    parse_address,
    parse_bytes32,
    parse_duration,
    parse_tokens,
    print_json,
    require_signer,
    stdout_console,
)

if TYPE_CHECKING:
    from ledger.client import Ledger
    from ledger.types import PoolInfo

app = command_app("prime-pool", "Own a compute pool: deploy the contracts, create and fund pools, appoint validators.")


validator_app = typer.Typer(help="Appoint or remove a pool's validators.", no_args_is_help=True)
app.add_typer(validator_app, name="validator")

PoolArgument = Annotated[int, typer.Argument(min=1, metavar="POOL", help="Pool id.")]
AmountArgument = Annotated[str, typer.Argument(metavar="AMOUNT", help="Whole tokens, e.g. 100 or 0.5.")]
ZERO_HASH = "0x" + "00" * 32


@app.command("deploy")
def deploy_command(
    rpc_url: Annotated[str, typer.Option("--rpc-url", metavar="URL", help="Chain JSON-RPC endpoint.")],
    keystore: KeystoreOption = None,
    dev_key: DevKeyOption = None,
    unbonding_period: Annotated[
        str,
        typer.Option(help="How long unstaked tokens wait before withdrawal; at least every pool's challenge window."),
    ] = "7d",
    min_challenge_window: Annotated[
        str, typer.Option(help="The shortest challenge window any pool of this deployment may have.")
    ] = "1h",
    out: Annotated[Path, typer.Option("--out", help="Where to write the deployment file.")] = DEFAULT_DEPLOYMENT,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
) -> None:
    """Deploy StakeToken, NodeRegistry, ComputePool and WorkLedger; write the deployment file."""
    with cli_errors():
        check_key_flags(keystore, dev_key, required=True)
        period = parse_duration(unbonding_period)
        min_window = parse_duration(min_challenge_window)
        if not 0 < min_window <= period:
            raise CommandError(
                f"--min-challenge-window {format_duration(min_window)} must be more than 0 and at most the "
                f"unbonding period {format_duration(period)}"
            )
        if out.exists() and not force:
            raise CommandError(f"{out} exists; pass --force to replace it (the contracts it names stay on chain)")
        from ledger.client import connect
        from ledger.deployment import deploy
        from ledger.tx import with_retries

        w3 = connect(rpc_url)
        chain_id = with_retries(lambda: w3.eth.chain_id, what="read chain id", url=rpc_url)
        account = require_signer(keystore, dev_key, chain_id=chain_id)
        deployment = deploy(w3, account, rpc_url=rpc_url, unbonding_period=period, min_challenge_window=min_window)
        deployment.save(out)
        console = stdout_console()
        console.print(f"deployed on chain {deployment.chain_id} ({rpc_url}) at block {deployment.block}")
        for name, address in deployment.contracts.items():
            console.print(f"  {name:<13} {address}")
        console.print(
            f"unbonding period {format_duration(period)}; challenge windows at least {format_duration(min_window)}; "
            f"StakeToken owner {account.address}"
        )
        console.print(f"wrote {out}")


@app.command()
@chain_flags()
def create(
    chain: ChainFlags,
    name: Annotated[str, typer.Option(help="Pool name.")],
    min_stake: Annotated[str, typer.Option(metavar="TOKENS", help="Stake each member node locks from its provider.")],
    reward_per_unit: Annotated[str, typer.Option(metavar="TOKENS", help="Reward per work unit (output token).")],
    slash: Annotated[
        str, typer.Option(metavar="TOKENS", help="Stake burned per invalidated work; at most --min-stake.")
    ],
    model_hash: Annotated[str, typer.Option(metavar="HEX32", help="Hash of the model being trained.")] = ZERO_HASH,
    spec_uri: Annotated[str, typer.Option(help="Where the pool's spec lives (coordinator URL, ...).")] = "",
    trainer: Annotated[str | None, typer.Option(metavar="ADDR", help="Trainer address; default: the signer.")] = None,
    challenge_window: Annotated[
        str, typer.Option(metavar="DURATION", help="How long validators may invalidate work (90m, 24h, ...).")
    ] = "24h",
    max_nodes: Annotated[int, typer.Option(min=0, help="Member limit; 0 for none.")] = 0,
    max_units_per_key: Annotated[
        int, typer.Option(min=1, max=2**48 - 1, help="Most units (output tokens) one submitted file may claim.")
    ] = 1_000_000,
    json_output: JsonOption = False,
) -> None:
    """Create a pool owned by the signer and print its id."""
    with cli_errors():
        model = parse_bytes32(model_hash, what="--model-hash")
        window = parse_duration(challenge_window)
        trainer_address = parse_address(trainer, what="--trainer") if trainer is not None else None
        ledger = chain.open_ledger()
        from ledger.types import PoolConfig

        config = PoolConfig(
            name=name,
            model_hash=model,
            spec_uri=spec_uri,
            trainer=trainer_address or ledger.address,
            min_stake_per_node=parse_tokens(min_stake, ledger.decimals, what="--min-stake"),
            challenge_window=window,
            reward_per_unit=parse_tokens(reward_per_unit, ledger.decimals, what="--reward-per-unit"),
            slash_amount=parse_tokens(slash, ledger.decimals, what="--slash"),
            max_nodes=max_nodes,
            max_units_per_key=max_units_per_key,
        )
        pool_id = ledger.create_pool(config)
        if json_output:
            print_json({"pool_id": pool_id})
        else:
            stdout_console().print(f"created pool {pool_id} {name!r}, owned by {ledger.address}")


@app.command()
@chain_flags()
def fund(chain: ChainFlags, pool: PoolArgument, amount: AmountArgument) -> None:
    """Move AMOUNT tokens from the signer into POOL's reward escrow (approving as needed)."""
    with cli_errors():
        ledger = chain.open_ledger()
        value = parse_tokens(amount, ledger.decimals, what="AMOUNT")
        ledger.fund_rewards(pool, value)
        escrow = format_tokens(ledger.escrow_of(pool), ledger.decimals)
        stdout_console().print(f"funded pool {pool} with {amount} tokens; escrow now {escrow} tokens")


def _validator_command(allowed: bool, doc: str) -> Callable[..., None]:
    """`prime-pool validator add` (allowed) or `remove`: the same arguments and call, with `doc` as its help."""

    @chain_flags()
    def command(
        chain: ChainFlags,
        pool: PoolArgument,
        address: Annotated[str, typer.Argument(metavar="ADDRESS", help="Validator address.")],
    ) -> None:
        with cli_errors():
            validator = parse_address(address, what="ADDRESS")
            ledger = chain.open_ledger()
            ledger.set_validator(pool, validator, allowed)
            stdout_console().print(f"{validator} {'may now' if allowed else 'may no longer'} validate pool {pool}")

    command.__doc__ = doc
    return command


validator_app.command("add")(_validator_command(True, "Let ADDRESS invalidate POOL's work (pool owner only)."))
validator_app.command("remove")(
    _validator_command(False, "Take back ADDRESS's right to invalidate POOL's work (pool owner only).")
)


@app.command()
@chain_flags()
def eject(
    chain: ChainFlags,
    pool: PoolArgument,
    node: Annotated[str, typer.Argument(metavar="NODE", help="Node address.")],
) -> None:
    """Remove NODE from POOL and ban it from joining again (pool owner only).

    Its work submitted before stays payable after its challenge window unless a validator invalidates it.
    """
    with cli_errors():
        address = parse_address(node, what="NODE")
        ledger = chain.open_ledger()
        ledger.eject(pool, address)
        stdout_console().print(
            f"ejected {address} from pool {pool}: it submits no more; its earlier work is still paid after its "
            "challenge window unless a validator invalidates it"
        )


@app.command()
@chain_flags()
def mint(
    chain: ChainFlags,
    to: Annotated[str, typer.Argument(metavar="TO", help="Recipient address.")],
    amount: AmountArgument,
) -> None:
    """Mint AMOUNT StakeTokens to TO (the token's owner only; for devnets and testnets)."""
    with cli_errors():
        recipient = parse_address(to, what="TO")
        ledger = chain.open_ledger()
        ledger.mint(recipient, parse_tokens(amount, ledger.decimals, what="AMOUNT"))
        balance = format_tokens(ledger.balance_of(recipient), ledger.decimals)
        stdout_console().print(f"minted {amount} tokens to {recipient}; balance now {balance}")


@app.command()
@chain_flags(signer=False)
def show(chain: ChainFlags, pool: PoolArgument, json_output: JsonOption = False) -> None:
    """Show POOL's configuration, escrow and members (read-only; no key needed)."""
    with cli_errors():
        ledger = chain.open_ledger(need_signer=False)
        info = ledger.pool(pool)
        view = _pool_view(ledger, info)
        if json_output:
            print_json(view)
            return
        _print_pool(view, ledger.decimals)


def _pool_view(ledger: Ledger, info: PoolInfo) -> dict[str, Any]:
    """The pool as JSON-ready data; amounts are base units as decimal strings (exact beyond 2^53)."""
    config = info.config
    members = []
    for node in ledger.members(info.pool_id):
        provider = ledger.provider_of(node)
        active = ledger.stake_of(provider).active if provider else 0
        locked = ledger.lock_of(info.pool_id, node).amount  # what a slash in this pool can take
        members.append({"node": node, "provider": provider, "stake_active": str(active), "locked_here": str(locked)})
    return {
        "pool_id": info.pool_id,
        "name": config.name,
        "owner": info.owner,
        "model_hash": "0x" + config.model_hash.hex(),
        "spec_uri": config.spec_uri,
        "trainer": config.trainer,
        "min_stake_per_node": str(config.min_stake_per_node),
        "challenge_window": config.challenge_window,
        "reward_per_unit": str(config.reward_per_unit),
        "slash_amount": str(config.slash_amount),
        "max_nodes": config.max_nodes,
        "max_units_per_key": config.max_units_per_key,
        "escrow": str(ledger.escrow_of(info.pool_id)),
        "burned_all_pools": str(ledger.burned()),
        "decimals": ledger.decimals,
        "members": members,
    }


def _print_pool(view: dict[str, Any], decimals: int) -> None:
    def tokens(key: str) -> str:
        return f"{format_tokens(int(view[key]), decimals)} tokens"

    table = Table("field", "value", title=f"pool {view['pool_id']}", title_justify="left", show_header=False)
    rows = [
        ("name", view["name"]),
        ("owner", view["owner"]),
        ("trainer", view["trainer"]),
        ("model hash", view["model_hash"]),
        ("spec URI", view["spec_uri"] or "-"),
        ("min stake per node", tokens("min_stake_per_node")),
        ("challenge window", format_duration(view["challenge_window"])),
        ("reward per unit", tokens("reward_per_unit")),
        ("slash amount", tokens("slash_amount")),
        ("max nodes", str(view["max_nodes"] or "unlimited")),
        ("max units per key", f"{view['max_units_per_key']:,}"),
        ("reward escrow", tokens("escrow")),
        ("slashed and burned", f"{tokens('burned_all_pools')} (every pool of this deployment)"),
    ]
    for field, value in rows:
        table.add_row(field, value)
    console = stdout_console()
    console.print(table)
    members = Table(title=f"{len(view['members'])} members", title_justify="left")
    for column in ("node", "provider"):
        members.add_column(column, no_wrap=True, min_width=42)  # an address is never cut
    members.add_column("provider stake", justify="right", no_wrap=True)
    members.add_column("locked here", justify="right", no_wrap=True)
    for member in view["members"]:
        stake = format_tokens(int(member["stake_active"]), decimals)
        members.add_row(
            member["node"], member["provider"] or "-", stake, format_tokens(int(member["locked_here"]), decimals)
        )
    console.print(members)


if __name__ == "__main__":
    app()
