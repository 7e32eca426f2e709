"""`prime-pool`: every command against the session's anvil, plus the shared CLI plumbing in ledger.cli.common."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from ledger.accounts import create_keystore, dev_account
from ledger.chain import LocalChain, free_port
from ledger.cli.common import CommandError, check_dev_key_allowed, check_key_flags, parse_duration
from ledger.cli.pool import app
from ledger.client import Ledger
from ledger.deployment import Deployment
from ledger.types import Reason
from tests.conftest import TOKEN, UNBONDING_PERIOD
from tests.ledger.helpers import commit_batch, make_pool, onboard

REPO_ROOT = Path(__file__).resolve().parents[2]
DEV_KEY_WARNING = "public, never use on a real chain"
PASSWORD = "pool owner password"
runner = CliRunner()


@pytest.fixture
def deployment_file(tmp_path: Path, deployment: Deployment, chain: LocalChain) -> Path:
    path = tmp_path / "deployment.json"
    deployment.save(path)
    return path


def pool_cli(*args: str | Path, password: str | None = None, debug: bool = False) -> Result:
    env = {
        "PRIME_DEPLOYMENT": None,
        "PRIME_KEYSTORE": None,
        "PRIME_KEYSTORE_PASSWORD": password,
        "PRIME_DEBUG": "1" if debug else None,
    }
    return runner.invoke(app, [str(arg) for arg in args], env=env)


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[-1].startswith("error: "), result.stderr
    assert sum(line.startswith("error:") for line in lines) == 1
    assert all(DEV_KEY_WARNING in line for line in lines[:-1]), result.stderr  # only the dev-key warning may precede
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[-1]


def create_args(deployment_file: Path, *extra: str) -> list[str | Path]:
    return [
        "create", "--name", "cli-pool", "--min-stake", "100", "--reward-per-unit", "0.001", "--slash", "50",
        "--challenge-window", "1h", "--deployment", deployment_file, *extra,
    ]  # fmt: skip


# --- deploy ------------------------------------------------------------------------------------------


def test_deploy_writes_deployment_and_prints_addresses(chain: LocalChain, tmp_path: Path) -> None:
    out = tmp_path / "out" / "deployment.json"
    result = pool_cli("deploy", "--rpc-url", chain.rpc_url, "--dev-key", "0", "--unbonding-period", "2d", "--out", out)
    assert result.exit_code == 0, result.output
    written = Deployment.load(out)
    assert written.chain_id == 31337 and written.rpc_url == chain.rpc_url
    for name, address in written.contracts.items():
        assert f"{name}" in result.stdout and address in result.stdout
    assert f"using anvil development key 0 ({dev_account(0).address}): {DEV_KEY_WARNING}" in result.stderr
    assert Ledger(chain.w3, written).unbonding_period() == 2 * 24 * 3600


def test_deploy_refuses_to_overwrite_without_force(chain: LocalChain, tmp_path: Path) -> None:
    out = tmp_path / "deployment.json"
    out.write_text("keep me\n")
    result = pool_cli("deploy", "--rpc-url", chain.rpc_url, "--dev-key", "0", "--out", out)
    assert_one_line_error(result, f"{out} exists; pass --force")
    assert out.read_text() == "keep me\n"
    forced = pool_cli("deploy", "--rpc-url", chain.rpc_url, "--dev-key", "0", "--out", out, "--force")
    assert forced.exit_code == 0, forced.output
    assert Deployment.load(out).chain_id == 31337


def test_deploy_without_key_is_refused_before_any_transaction(chain: LocalChain, tmp_path: Path) -> None:
    result = pool_cli("deploy", "--rpc-url", chain.rpc_url, "--out", tmp_path / "d.json")
    assert_one_line_error(result, "pass --keystore FILE (or --dev-key N")
    assert not (tmp_path / "d.json").exists()


# --- create, fund, mint ------------------------------------------------------------------------------


def test_create_json_prints_pool_id_and_sets_every_field(
    deployment_file: Path, ledger_for: Callable[[int], Ledger]
) -> None:
    trainer = dev_account(5).address
    result = pool_cli(
        *create_args(deployment_file, "--json", "--trainer", trainer.lower(), "--max-nodes", "3"),
        "--model-hash", "ab" * 32, "--spec-uri", "http://coordinator", "--dev-key", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    pool_id = json.loads(result.stdout)["pool_id"]
    info = ledger_for(0).pool(pool_id)
    assert info.owner == dev_account(0).address
    config = info.config
    assert (config.name, config.trainer, config.spec_uri) == ("cli-pool", trainer, "http://coordinator")
    assert config.model_hash == bytes.fromhex("ab" * 32)
    assert (config.min_stake_per_node, config.reward_per_unit, config.slash_amount) == (
        100 * TOKEN,
        TOKEN // 1000,
        50 * TOKEN,
    )
    assert (config.challenge_window, config.max_nodes) == (3600, 3)


def test_create_defaults_trainer_to_signer_and_prints_id(
    deployment_file: Path, ledger_for: Callable[[int], Ledger]
) -> None:
    result = pool_cli(*create_args(deployment_file, "--dev-key", "1"))
    assert result.exit_code == 0, result.output
    assert "created pool 1 'cli-pool'" in result.stdout
    config = ledger_for(0).pool(1).config
    assert config.trainer == dev_account(1).address
    assert config.model_hash == bytes(32)


def test_create_window_longer_than_unbonding_shows_the_revert(deployment_file: Path) -> None:
    result = pool_cli(*create_args(deployment_file, "--dev-key", "0", "--challenge-window", "30d"))
    assert_one_line_error(result, "createPool reverted: ChallengeWindowTooLong", f"unbondingPeriod={UNBONDING_PERIOD}")


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (("--challenge-window", "59m"), ("createPool reverted: ChallengeWindowTooShort", "minChallengeWindow=3600")),
        (("--slash", "100.5"), ("createPool reverted: SlashAmountOutOfRange", f"minStakePerNode={100 * TOKEN}")),
        (("--min-stake", "0"), ("createPool reverted: MinStakeOutOfRange", "minStakePerNode=0")),
    ],
    ids=["short-window", "slash-above-min-stake", "zero-min-stake"],
)
def test_create_with_terms_out_of_range_shows_the_revert(
    deployment_file: Path, flags: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    args = create_args(deployment_file, "--dev-key", "0")
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        args[args.index(flag) + 1] = value
    assert_one_line_error(pool_cli(*args), *fragments)


def test_create_sets_max_units_per_key(deployment_file: Path, ledger_for: Callable[[int], Ledger]) -> None:
    result = pool_cli(*create_args(deployment_file, "--dev-key", "0", "--max-units-per-key", "8192", "--json"))
    assert result.exit_code == 0, result.output
    assert ledger_for(0).pool(json.loads(result.stdout)["pool_id"]).config.max_units_per_key == 8192


def test_deploy_sets_the_min_challenge_window(chain: LocalChain, tmp_path: Path) -> None:
    out = tmp_path / "deployment.json"
    args = ("deploy", "--rpc-url", chain.rpc_url, "--dev-key", "0", "--unbonding-period", "2d")
    result = pool_cli(*args, "--min-challenge-window", "10m", "--out", out)
    assert result.exit_code == 0, result.output
    assert "challenge windows at least" in result.stdout
    assert Ledger(chain.w3, Deployment.load(out)).min_challenge_window() == 600


@pytest.mark.parametrize("window", ["0", "3d"])
def test_deploy_refuses_a_min_challenge_window_outside_the_unbonding_period(
    chain: LocalChain, tmp_path: Path, window: str
) -> None:
    out = tmp_path / "deployment.json"
    args = ("deploy", "--rpc-url", chain.rpc_url, "--dev-key", "0", "--unbonding-period", "2d")
    result = pool_cli(*args, "--min-challenge-window", window, "--out", out)
    assert_one_line_error(result, "--min-challenge-window", "at most the unbonding period")
    assert not out.exists()


def test_mint_then_fund_moves_tokens_into_escrow(deployment_file: Path, ledger_for: Callable[[int], Ledger]) -> None:
    owner = ledger_for(0)
    pool_id = make_pool(owner)
    minted = pool_cli("mint", owner.address, "250", "--deployment", deployment_file, "--dev-key", "0")
    assert minted.exit_code == 0, minted.output
    assert "balance now 250" in minted.stdout
    funded = pool_cli("fund", str(pool_id), "100.5", "--deployment", deployment_file, "--dev-key", "0")
    assert funded.exit_code == 0, funded.output
    assert "escrow now 100.5 tokens" in funded.stdout
    assert owner.escrow_of(pool_id) == 100 * TOKEN + TOKEN // 2
    assert owner.balance_of(owner.address) == 150 * TOKEN - TOKEN // 2


def test_mint_by_someone_else_than_the_token_owner_is_one_line(deployment_file: Path) -> None:
    result = pool_cli("mint", dev_account(1).address, "5", "--deployment", deployment_file, "--dev-key", "1")
    assert_one_line_error(result, "mint reverted: OwnableUnauthorizedAccount")


def test_keystore_signs_without_dev_key_warning(deployment_file: Path, tmp_path: Path) -> None:
    keystore = create_keystore(tmp_path / "keys", PASSWORD, private_key=dev_account(0).key, iterations=2**10)
    result = pool_cli(*create_args(deployment_file, "--keystore", str(keystore)), password=PASSWORD)
    assert result.exit_code == 0, result.output
    assert "created pool 1" in result.stdout
    assert "anvil development key" not in result.output


# --- validators, eject, show -------------------------------------------------------------------------


def test_validator_add_then_remove(deployment_file: Path, ledger_for: Callable[[int], Ledger]) -> None:
    owner = ledger_for(0)
    pool_id = make_pool(owner)
    validator = dev_account(4).address
    added = pool_cli("validator", "add", str(pool_id), validator, "--deployment", deployment_file, "--dev-key", "0")
    assert added.exit_code == 0, added.output
    assert owner.is_validator(pool_id, validator)
    args = ("validator", "remove", str(pool_id), validator, "--deployment", deployment_file, "--dev-key", "0")
    removed = pool_cli(*args)
    assert removed.exit_code == 0, removed.output
    assert not owner.is_validator(pool_id, validator)


def test_validator_add_by_non_owner_shows_the_revert(
    deployment_file: Path, ledger_for: Callable[[int], Ledger]
) -> None:
    pool_id = make_pool(ledger_for(0))
    args = ("validator", "add", str(pool_id), dev_account(4).address, "--deployment", deployment_file, "--dev-key", "3")
    assert_one_line_error(pool_cli(*args), "setValidator reverted: NotPoolOwner")


def test_eject_removes_and_bans_a_member(deployment_file: Path, ledger_for: Callable[[int], Ledger]) -> None:
    owner = ledger_for(0)
    pool_id = make_pool(owner)
    node = dev_account(2)
    onboard(owner, ledger_for(1), node, pool_id)
    result = pool_cli("eject", str(pool_id), node.address, "--deployment", deployment_file, "--dev-key", "0")
    assert result.exit_code == 0, result.output
    assert not owner.is_member(pool_id, node.address)
    assert owner.is_ejected(pool_id, node.address)


def test_show_lists_config_escrow_and_members(deployment_file: Path, ledger_for: Callable[[int], Ledger]) -> None:
    owner, provider = ledger_for(0), ledger_for(1)
    pool_id = make_pool(owner, name="shown", spec_uri="http://spec", max_nodes=7)
    node = dev_account(2)
    onboard(owner, provider, node, pool_id, stake_tokens=150)
    owner.mint(owner.address, 40 * TOKEN)
    owner.fund_rewards(pool_id, 40 * TOKEN)

    text = pool_cli("show", str(pool_id), "--deployment", deployment_file)
    assert text.exit_code == 0, text.output
    for expected in ("shown", owner.address, "http://spec", "100 tokens", "1h", "0.001 tokens", "50 tokens", "7"):
        assert expected in text.stdout
    assert "40 tokens" in text.stdout  # escrow
    assert node.address in text.stdout and provider.address in text.stdout and "150" in text.stdout

    as_json = pool_cli("show", str(pool_id), "--json", "--deployment", deployment_file)
    assert as_json.exit_code == 0, as_json.output
    view = json.loads(as_json.stdout)
    assert view["escrow"] == str(40 * TOKEN) and view["min_stake_per_node"] == str(100 * TOKEN)
    assert (view["max_units_per_key"], view["burned_all_pools"]) == (1_000_000, "0")
    assert view["members"] == [
        {
            "node": node.address,
            "provider": provider.address,
            "stake_active": str(150 * TOKEN),
            "locked_here": str(100 * TOKEN),
        }
    ]


def test_show_lists_each_members_lock_here_and_the_burned_total(
    deployment_file: Path, ledger_for: Callable[[int], Ledger]
) -> None:
    owner, provider, validator = ledger_for(0), ledger_for(1), ledger_for(9)
    pool_id = make_pool(owner, max_units_per_key=4096)  # locks 100, slashes 50
    owner.set_validator(pool_id, validator.address)
    cheater = onboard(owner, provider, dev_account(2), pool_id, stake_tokens=200)
    honest = onboard(owner, provider, dev_account(3), pool_id, stake_tokens=0)
    forged, _ = commit_batch(cheater, pool_id, ("forged", 10))
    validator.invalidate_batch(pool_id, cheater.address, forged.root, forged.proof(0), Reason.BAD_FORMAT)

    text = pool_cli("show", str(pool_id), "--deployment", deployment_file)
    assert text.exit_code == 0, text.output
    assert "4,096" in text.stdout and "slashed and burned" in text.stdout and "locked here" in text.stdout

    view = json.loads(pool_cli("show", str(pool_id), "--json", "--deployment", deployment_file).stdout)
    assert (view["max_units_per_key"], view["burned_all_pools"]) == (4096, str(50 * TOKEN))
    assert view["members"] == [  # the ejected cheater is no member; its held lock is not listed
        {
            "node": honest.address,
            "provider": provider.address,
            "stake_active": str(150 * TOKEN),
            "locked_here": str(100 * TOKEN),
        }
    ]


def test_show_of_unknown_pool_is_one_line(deployment_file: Path) -> None:
    assert_one_line_error(pool_cli("show", "9", "--deployment", deployment_file), "PoolNotFound(poolId=9)")


# --- error paths shared by every command -------------------------------------------------------------


def test_signing_command_without_key_is_one_line(deployment_file: Path) -> None:
    result = pool_cli(*create_args(deployment_file))
    assert_one_line_error(result, "this command signs a transaction: pass --keystore FILE (or --dev-key N")
    assert result.stderr.count("\n") == 1


def test_keystore_and_dev_key_together_are_refused(deployment_file: Path, tmp_path: Path) -> None:
    result = pool_cli(*create_args(deployment_file, "--dev-key", "0", "--keystore", str(tmp_path / "k.json")))
    assert_one_line_error(result, "give --keystore or --dev-key, not both")


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ("abc", "--min-stake: not a token amount: 'abc'"),
        ("-1", "--min-stake: token amount must be a non-negative number, got '-1'"),
        ("1.0000000000000000001", "--min-stake: '1.0000000000000000001' has more than 18 decimal places"),
    ],
)
def test_bad_amount_is_one_line(deployment_file: Path, amount: str, message: str) -> None:
    args = create_args(deployment_file, "--dev-key", "0")
    args[args.index("--min-stake") + 1] = amount
    assert_one_line_error(pool_cli(*args), message)


def test_bad_duration_is_one_line(deployment_file: Path) -> None:
    result = pool_cli(*create_args(deployment_file, "--dev-key", "0", "--challenge-window", "soon"))
    assert_one_line_error(result, "not a duration: 'soon'")


def test_dev_key_on_a_non_local_chain_deployment_is_refused(chain: LocalChain, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.json"
    Deployment(1337, chain.rpc_url, 1, {name: dev_account(9).address for name in (
        "StakeToken", "NodeRegistry", "ComputePool", "WorkLedger")}).save(foreign)  # fmt: skip
    result = pool_cli(*create_args(foreign, "--dev-key", "0"))
    assert_one_line_error(result, "--dev-key is refused on chain 1337")
    assert DEV_KEY_WARNING not in result.stderr  # refused before the key is even derived


def test_deployment_on_another_chain_than_the_rpc_is_one_line(chain: LocalChain, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.json"
    Deployment(1337, chain.rpc_url, 1, {name: dev_account(9).address for name in (
        "StakeToken", "NodeRegistry", "ComputePool", "WorkLedger")}).save(foreign)  # fmt: skip
    result = pool_cli("show", "1", "--deployment", foreign)
    assert_one_line_error(result, "is chain 31337, but the deployment is on chain 1337")


def test_missing_deployment_file_says_to_deploy(tmp_path: Path) -> None:
    result = pool_cli("show", "1", "--deployment", tmp_path / "absent.json")
    assert_one_line_error(result, "run `prime-pool deploy` first")


def test_unreachable_rpc_is_one_line_without_retry_noise(tmp_path: Path) -> None:
    dead = tmp_path / "dead.json"
    Deployment(31337, f"http://127.0.0.1:{free_port()}", 1, {name: dev_account(9).address for name in (
        "StakeToken", "NodeRegistry", "ComputePool", "WorkLedger")}).save(dead)  # fmt: skip
    code = "import sys; from ledger.cli.pool import app; sys.argv[0] = 'prime-pool'; app()"
    args = [sys.executable, "-c", code, "show", "1", "--deployment", str(dead)]
    completed = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert completed.returncode == 1
    [line] = completed.stderr.splitlines()
    assert line.startswith("error: chain RPC http://127.0.0.1:") and "unreachable" in line


def test_debug_variable_shows_the_traceback(deployment_file: Path) -> None:
    result = pool_cli("show", "9", "--deployment", deployment_file, debug=True)
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "ContractRevert" in result.stderr


# --- helpers of ledger.cli.common --------------------------------------------------------------------


def test_dev_key_allowed_only_on_chain_31337() -> None:
    check_dev_key_allowed(31337)
    for chain_id in (1, 1337, 11155111):
        with pytest.raises(CommandError, match=f"refused on chain {chain_id}"):
            check_dev_key_allowed(chain_id)
    with pytest.raises(CommandError, match="--node-dev-key is refused"):
        check_dev_key_allowed(1, "--node-dev-key")


def test_key_flags_need_exactly_one_when_signing(tmp_path: Path) -> None:
    check_key_flags(None, None, required=False)
    check_key_flags(tmp_path, None, required=True)
    check_key_flags(None, 3, required=True)
    with pytest.raises(CommandError, match="signs a transaction"):
        check_key_flags(None, None, required=True)
    with pytest.raises(CommandError, match="not both"):
        check_key_flags(tmp_path, 0, required=False)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3600", 3600), ("90m", 5400), ("24h", 86_400), ("7d", 604_800), ("1h30m", 5400), ("45s", 45), ("2w", 1_209_600)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-5", "1.5h", "10y", "24 h"])
def test_parse_duration_rejects_nonsense(text: str) -> None:
    with pytest.raises(CommandError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("module", ["ledger.cli.pool", "node.cli.main"])
def test_help_runs_without_importing_web3(module: str) -> None:
    code = (
        f"import sys, {module} as cli\n"
        "try:\n    cli.app(['--help'])\nexcept SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
        "print('web3' in sys.modules, 'eth_account' in sys.modules)"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert "Usage" in completed.stdout
    assert completed.stdout.splitlines()[-1] == "False False"
