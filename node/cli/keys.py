"""`prime-node keys`: create, list, inspect and import encrypted keystore files.

Thin commands: validate flags, call `ledger.accounts`, print. `ledger.accounts` pulls in
eth-account, so it is imported inside each command to keep `--help` instant. The password comes
from PRIME_KEYSTORE_PASSWORD or a hidden prompt, and is never echoed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ledger.cli.common import cli_errors, stdout_console

if TYPE_CHECKING:
    from ledger.accounts import KeystoreInfo

DEFAULT_KEY_DIR = Path("~/.prime/keys")

keys_app = typer.Typer(help="Create and inspect encrypted keystore files", no_args_is_help=True)

DirOption = typer.Option(DEFAULT_KEY_DIR, "--dir", help="Directory holding keystore files.")
LabelOption = typer.Option(
    None,
    "--label",
    help="Name the file '<label>--<address>.json' instead of geth's 'UTC--<time>--<address>'.",
)


def _print_dev_warning(console: Console) -> None:
    from ledger.accounts import DEV_KEY_LABEL

    console.print(Text(f"warning: {DEV_KEY_LABEL}", style="bold yellow"))


def _print_written(address: str, path: Path) -> None:
    console = stdout_console()
    console.print(f"address: {address}")
    console.print(f"file:    {path}")


@keys_app.command("new")
def new(key_dir: Path = DirOption, label: str | None = LabelOption) -> None:
    """Create a new random key and save it as an encrypted keystore file."""
    with cli_errors():
        from ledger import accounts

        password = accounts.resolve_password(confirm=True)
        path = accounts.create_keystore(key_dir.expanduser(), password, label=label)
        _print_written(accounts.read_keystore(path).address, path)


@keys_app.command("list")
def list_(key_dir: Path = DirOption) -> None:
    """List the keystore files in a directory (no password needed)."""
    with cli_errors():
        from ledger import accounts

        key_dir = key_dir.expanduser()
        infos = accounts.list_keystores(key_dir)
        console = stdout_console()
        if not infos:
            console.print(f"no keystore files in {key_dir}")
            return
        console.print(_keystore_table(key_dir, infos))


def _keystore_table(key_dir: Path, infos: list[KeystoreInfo]) -> Table:
    from ledger.accounts import DEV_KEY_LABEL, is_dev_address

    table = Table("label", "address", "file", title=f"keystores in {key_dir}", title_justify="left")
    table.columns[1].no_wrap = True
    table.columns[2].overflow = "fold"
    has_dev_key = False
    for info in infos:
        label = Text(info.label or "-")
        if is_dev_address(info.address):
            has_dev_key = True
            label.append(" *", style="bold yellow")
        table.add_row(label, info.address, info.path.name)
    if has_dev_key:
        table.caption = Text(f"* {DEV_KEY_LABEL}", style="yellow")
    return table


def _resolve_file(file: Path, key_dir: Path) -> Path:
    """FILE as given if it exists, else looked up inside --dir (so a bare file name works)."""
    file = file.expanduser()
    if file.exists() or file.is_absolute():
        return file
    return key_dir.expanduser() / file


@keys_app.command("show")
def show(
    file: Path = typer.Argument(..., help="Keystore file, as a path or a name inside --dir."),
    key_dir: Path = DirOption,
    check: bool = typer.Option(False, "--check", help="Decrypt with the password to prove it opens."),
) -> None:
    """Show a keystore's address; with --check, also decrypt it."""
    with cli_errors():
        from ledger import accounts

        path = _resolve_file(file, key_dir)
        info = accounts.read_keystore(path)
        console = stdout_console()
        console.print(f"address: {info.address}")
        console.print(f"file:    {path}")
        if info.label is not None:
            console.print(f"label:   {info.label}")
        if accounts.is_dev_address(info.address):
            _print_dev_warning(console)
        if check:
            account = accounts.load_account(path, accounts.resolve_password())
            console.print(f"password OK: decrypts to {account.address}")


@keys_app.command("import-dev")
def import_dev(
    index: int = typer.Argument(..., min=0, max=9, help="Anvil account index, 0-9."),
    key_dir: Path = DirOption,
    label: str | None = LabelOption,
) -> None:
    """Save anvil's public development key INDEX as a keystore, for local devnets only."""
    with cli_errors():
        from ledger import accounts

        account = accounts.dev_account(index)
        password = accounts.resolve_password(confirm=True)
        path = accounts.create_keystore(
            key_dir.expanduser(), password, label=label or f"anvil-dev-{index}", private_key=account.key
        )
        _print_written(account.address, path)
        _print_dev_warning(stdout_console())
