"""The committed contract artifacts: fresh against the sources, shaped as DESIGN section 4 says, revert decoding."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from eth_abi import encode as abi_encode
from eth_utils import keccak, to_checksum_address

from ledger.artifacts import ARTIFACT_DIR, CONTRACT_NAMES, decode_revert, load_artifact

CONTRACTS_DIR = ARTIFACT_DIR.parent
POOL_CONFIG = "(string,bytes32,string,address,uint256,uint64,uint256,uint256,uint32,uint64)"
LEAF_PROOF = "(uint256,bytes32,uint256,bytes32[])"  # IWorkLedger.LeafProof: index, workKey, units, siblings
BATCH_REF = "(uint256,bytes32)"  # IWorkLedger.BatchRef: the node's batch slot and the batch's root

# DESIGN section 4: function signature -> output types, per contract.
FUNCTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "StakeToken": {"mint(address,uint256)": ()},
    "NodeRegistry": {
        "stake(uint256)": (),
        "requestUnstake(uint256)": (),
        "withdraw()": (),
        "addNode(address,bytes)": (),
        "removeNode(address)": (),
        "slash(uint256,address,uint256)": ("uint256",),
        "lockStake(uint256,address,uint256)": ("address",),
        "unlockStake(uint256,address,uint64)": (),
        "releaseStake(uint256,address)": (),
        "stakeOf(address)": ("uint256", "uint256"),
        "lockedOf(address)": ("uint256",),
        "lockOf(uint256,address)": ("uint256", "uint64", "bool", "bool"),
        "burned()": ("uint256",),
        "providerOf(address)": ("address",),
        "nodesOf(address)": ("address[]",),
        "unbondingPeriod()": ("uint64",),
    },
    "ComputePool": {
        f"createPool({POOL_CONFIG})": ("uint256",),
        "setValidator(uint256,address,bool)": (),
        "join(uint256)": (),
        "leave(uint256)": (),
        "eject(uint256,address)": (),
        "ejectForInvalidation(uint256,address)": (),
        "ejectionOf(uint256,address)": ("uint8",),
        "getPool(uint256)": (POOL_CONFIG, "address"),
        "terms(uint256)": ("uint64", "uint256", "uint256", "uint64"),
        "memberTerms(uint256,address)": ("address", "uint64"),
        "minChallengeWindow()": ("uint64",),
        "isMember(uint256,address)": ("bool",),
        "isValidator(uint256,address)": ("bool",),
        "members(uint256)": ("address[]",),
    },
    "WorkLedger": {
        "fundRewards(uint256,uint256)": (),
        "submitBatch(uint256,uint256,bytes32,uint256,uint256)": (),
        f"invalidateBatch(uint256,address,{BATCH_REF},{LEAF_PROOF},uint8)": (),
        f"invalidateUnavailableBatch(uint256,address,{BATCH_REF})": (),
        f"refuseLeaf(uint256,address,{BATCH_REF},{LEAF_PROOF},uint8)": (),
        f"claimBatches(uint256,address,{BATCH_REF}[])": (),
        "getBatch(uint256,address,uint256)": (
            "bytes32",
            "address",
            "uint256",
            "uint256",
            "uint256",
            "uint64",
            "uint8",
        ),
        "isLeafRefused(uint256,address,bytes32,uint256)": ("bool",),
    },
}
VIEWS = {
    "stakeOf",
    "lockedOf",
    "lockOf",
    "burned",
    "providerOf",
    "nodesOf",
    "unbondingPeriod",
    "getPool",
    "terms",
    "memberTerms",
    "minChallengeWindow",
    "isMember",
    "isValidator",
    "ejectionOf",
    "members",
    "getBatch",
    "isLeafRefused",
}
# The old ABI: a slash paid into any pool's escrow from unbonding stake, a claim could mix nodes, a batch record was
# keyed by its root (a fresh storage slot every batch). None of it may come back.
REMOVED_FUNCTIONS: dict[str, set[str]] = {
    "NodeRegistry": {
        "slash(address,uint256,address)",
        "lockStake(address,uint256)",
        "unlockStake(address,uint256)",
        "isCollateralized(address)",
    },
    "WorkLedger": {
        "submitBatch(uint256,bytes32,uint256,uint256)",
        f"invalidateBatch(uint256,address,bytes32,{LEAF_PROOF},uint8)",
        "invalidateUnavailableBatch(uint256,address,bytes32)",
        f"refuseLeaf(uint256,address,bytes32,{LEAF_PROOF},uint8)",
        "claimBatches(uint256,address,bytes32[])",
        "getBatch(uint256,address,bytes32)",
    },
}
REMOVED_ERRORS: dict[str, set[str]] = {
    "ComputePool": {"ChallengeWindowZero"},
    "WorkLedger": {"MixedProviders", "ProviderUndercollateralized", "BatchExists"},
}
EVENTS: dict[str, set[str]] = {
    "NodeRegistry": {
        "Staked(address,uint256)",
        "UnstakeRequested(address,uint256,uint64)",
        "Withdrawn(address,uint256)",
        "NodeAdded(address,address)",
        "NodeRemoved(address,address)",
        "Slashed(address,address,uint256,uint256)",
        "StakeLocked(address,address,uint256,uint256)",
        "StakeUnlocked(address,address,uint256,uint256,uint64)",
        "StakeReleased(address,address,uint256,uint256)",
    },
    "ComputePool": {
        "PoolCreated(uint256,address,string,address)",
        "ValidatorSet(uint256,address,bool)",
        "NodeJoined(uint256,address,address)",
        "NodeLeft(uint256,address)",
        "NodeEjected(uint256,address,address,uint8)",
    },
    "WorkLedger": {
        "BatchSubmitted(uint256,bytes32,address,uint256,uint256,uint256)",  # no provider: the node's binding names it
        "BatchInvalidated(uint256,bytes32,address,address,uint256,bytes32,uint8,uint256)",
        "LeafRefused(uint256,bytes32,address,address,uint256,bytes32,uint256,uint8)",
        f"BatchesClaimed(uint256,address,address,uint256,{BATCH_REF}[])",
    },
}


def canonical_type(entry: dict[str, Any]) -> str:
    kind: str = entry["type"]
    if kind.startswith("tuple"):
        return "(" + ",".join(canonical_type(c) for c in entry["components"]) + ")" + kind[len("tuple") :]
    return kind


def signature(entry: dict[str, Any]) -> str:
    return f"{entry['name']}({','.join(canonical_type(arg) for arg in entry['inputs'])})"


def abi_entries(contract: str, kind: str) -> dict[str, dict[str, Any]]:
    return {signature(e): e for e in load_artifact(contract).abi if e["type"] == kind}


def run_check(contracts_dir: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    assert node is not None, "node is needed to check the artifacts (make install)"
    return subprocess.run(
        [node, "build.js", "--check"], cwd=contracts_dir, capture_output=True, text=True, timeout=120, check=False
    )


# --- freshness --------------------------------------------------------------------------------------


def test_committed_artifacts_match_a_fresh_build() -> None:
    result = run_check(CONTRACTS_DIR)
    assert result.returncode == 0, result.stderr
    assert "checked 4 contracts" in result.stdout


def test_check_fails_when_a_source_changed(tmp_path: Path) -> None:
    copy = tmp_path / "contracts"
    copy.mkdir()
    shutil.copytree(CONTRACTS_DIR / "src", copy / "src")
    shutil.copytree(CONTRACTS_DIR / "artifacts", copy / "artifacts")
    for name in ("build.js", "package.json"):
        shutil.copy2(CONTRACTS_DIR / name, copy / name)
    (copy / "node_modules").symlink_to(CONTRACTS_DIR / "node_modules", target_is_directory=True)
    with (copy / "src" / "WorkLedger.sol").open("a") as source:
        source.write("\n// a harmless comment still changes the source hash\n")
    before = {path.name: path.read_bytes() for path in (copy / "artifacts").iterdir()}

    result = run_check(copy)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "stale artifact" in result.stderr
    # every artifact records the hash of all sources, so all four are stale
    assert result.stderr.count("stale artifact") == len(CONTRACT_NAMES)
    assert {path.name: path.read_bytes() for path in (copy / "artifacts").iterdir()} == before  # --check writes nothing


def test_artifacts_share_one_source_hash_and_the_pinned_compiler() -> None:
    pinned = json.loads((CONTRACTS_DIR / "package.json").read_text())["devDependencies"]["solc"]
    artifacts = [load_artifact(name) for name in CONTRACT_NAMES]
    assert {a.name for a in artifacts} == set(CONTRACT_NAMES)
    assert len({a.source_hash for a in artifacts}) == 1
    assert all(a.compiler_version.startswith(f"{pinned}+") for a in artifacts)
    assert all(a.bytecode.startswith("0x") and len(a.bytecode) > 2 for a in artifacts)


# --- ABI shape (DESIGN section 4) -------------------------------------------------------------------


@pytest.mark.parametrize("contract", sorted(FUNCTIONS))
def test_abi_has_the_designed_functions(contract: str) -> None:
    functions = abi_entries(contract, "function")
    for sig, outputs in FUNCTIONS[contract].items():
        assert sig in functions, f"{contract} lacks {sig}"
        entry = functions[sig]
        assert tuple(canonical_type(out) for out in entry["outputs"]) == outputs, sig
        if entry["name"] in VIEWS:
            assert entry["stateMutability"] == "view", sig
        else:
            assert entry["stateMutability"] == "nonpayable", sig


@pytest.mark.parametrize("contract", sorted(EVENTS))
def test_abi_has_the_designed_events(contract: str) -> None:
    assert EVENTS[contract] <= set(abi_entries(contract, "event"))


@pytest.mark.parametrize("contract", sorted(REMOVED_FUNCTIONS.keys() | REMOVED_ERRORS.keys()))
def test_abi_has_none_of_the_removed_functions_and_errors(contract: str) -> None:
    assert not REMOVED_FUNCTIONS.get(contract, set()) & set(abi_entries(contract, "function"))
    errors = {e["name"] for e in load_artifact(contract).abi if e["type"] == "error"}
    assert not REMOVED_ERRORS.get(contract, set()) & errors


def test_pool_config_fields_are_in_design_order() -> None:
    (create,) = [e for e in load_artifact("ComputePool").abi if e.get("name") == "createPool"]
    fields = [component["name"] for component in create["inputs"][0]["components"]]
    assert fields == [
        "name",
        "modelHash",
        "specURI",
        "trainer",
        "minStakePerNode",
        "challengeWindow",
        "rewardPerUnit",
        "slashAmount",
        "maxNodes",
        "maxUnitsPerKey",
    ]


def test_get_batch_takes_the_node_and_slot_and_returns_the_slots_record_with_its_root() -> None:
    get_batch = abi_entries("WorkLedger", "function")["getBatch(uint256,address,uint256)"]
    assert [arg["name"] for arg in get_batch["inputs"]] == ["poolId", "node", "slot"]
    assert [out["name"] for out in get_batch["outputs"]] == [
        "root",
        "provider",
        "count",
        "totalUnits",
        "refusedUnits",
        "submittedAt",
        "status",
    ]
    assert get_batch["outputs"][6]["internalType"] == "enum IWorkLedger.BatchStatus"
    (leaf,) = [e for e in load_artifact("WorkLedger").abi if e.get("name") == "refuseLeaf"]
    assert [c["name"] for c in leaf["inputs"][2]["components"]] == ["slot", "root"]
    assert leaf["inputs"][2]["internalType"] == "struct IWorkLedger.BatchRef"
    assert [c["name"] for c in leaf["inputs"][3]["components"]] == ["index", "workKey", "units", "siblings"]
    (submit,) = [e for e in load_artifact("WorkLedger").abi if e.get("name") == "submitBatch"]
    assert [arg["name"] for arg in submit["inputs"]] == ["poolId", "slot", "root", "count", "totalUnits"]


def test_batch_events_name_their_arguments_as_designed() -> None:
    work_events = abi_entries("WorkLedger", "event")
    names = {sig: [arg["name"] for arg in e["inputs"]] for sig, e in work_events.items()}
    assert names["BatchSubmitted(uint256,bytes32,address,uint256,uint256,uint256)"] == [
        "poolId",
        "root",
        "node",
        "slot",
        "count",
        "totalUnits",
    ]
    assert names["BatchInvalidated(uint256,bytes32,address,address,uint256,bytes32,uint8,uint256)"] == [
        "poolId",
        "root",
        "node",
        "validator",
        "leafIndex",
        "workKey",
        "reason",
        "slashed",
    ]
    assert names["LeafRefused(uint256,bytes32,address,address,uint256,bytes32,uint256,uint8)"] == [
        "poolId",
        "root",
        "node",
        "validator",
        "leafIndex",
        "workKey",
        "units",
        "reason",
    ]
    assert names[f"BatchesClaimed(uint256,address,address,uint256,{BATCH_REF}[])"] == [
        "poolId",
        "provider",
        "node",
        "amount",
        "batches",
    ]
    claimed = work_events[f"BatchesClaimed(uint256,address,address,uint256,{BATCH_REF}[])"]
    assert [c["name"] for c in claimed["inputs"][4]["components"]] == ["slot", "root"]


def test_stake_events_name_their_arguments_as_designed() -> None:
    registry_events = abi_entries("NodeRegistry", "event")
    names = {sig: [arg["name"] for arg in e["inputs"]] for sig, e in registry_events.items()}
    assert names["Slashed(address,address,uint256,uint256)"] == ["provider", "node", "poolId", "amount"]
    assert names["StakeLocked(address,address,uint256,uint256)"] == ["provider", "node", "poolId", "amount"]
    assert names["StakeUnlocked(address,address,uint256,uint256,uint64)"] == [
        "provider",
        "node",
        "poolId",
        "amount",
        "releaseAt",
    ]
    assert names["StakeReleased(address,address,uint256,uint256)"] == ["provider", "node", "poolId", "amount"]


# --- decode_revert ----------------------------------------------------------------------------------


def error_data(sig: str, types: list[str], values: list[Any]) -> bytes:
    return keccak(text=sig)[:4] + abi_encode(types, values)


def test_decode_revert_decodes_custom_errors_with_names() -> None:
    root, node = keccak(text="batch"), "0x" + "cd" * 20
    types = ["uint256", "address", "bytes32", "uint8"]
    data = error_data("BatchNotPending(uint256,address,bytes32,uint8)", types, [3, node, root, 2])
    name, values = decode_revert(data)
    assert name == "BatchNotPending"
    assert values.keys() == {"poolId", "node", "root", "status"}
    assert (values["poolId"], to_checksum_address(values["node"])) == (3, to_checksum_address(node))
    assert (values["root"], values["status"]) == (root, 2)


def test_decode_revert_decodes_errors_of_the_new_terms() -> None:
    data = error_data("SlashAmountOutOfRange(uint256,uint256)", ["uint256", "uint256"], [101, 100])
    assert decode_revert(data) == ("SlashAmountOutOfRange", {"slashAmount": 101, "minStakePerNode": 100})
    node = "0x" + "ef" * 20
    name, values = decode_revert(error_data("NodeEjected(uint256,address)", ["uint256", "address"], [4, node]))
    assert (name, values["poolId"], to_checksum_address(values["node"])) == (
        "NodeEjected",
        4,
        to_checksum_address(node),
    )


def test_decode_revert_decodes_inherited_openzeppelin_errors() -> None:
    account, role = "0x" + "ab" * 20, keccak(text="SLASHER_ROLE")
    data = error_data("AccessControlUnauthorizedAccount(address,bytes32)", ["address", "bytes32"], [account, role])
    name, values = decode_revert(data)
    assert name == "AccessControlUnauthorizedAccount"
    assert values.keys() == {"account", "neededRole"}
    assert (to_checksum_address(values["account"]), values["neededRole"]) == (to_checksum_address(account), role)


def test_decode_revert_decodes_error_string() -> None:
    data = error_data("Error(string)", ["string"], ["ERC20: boom"])
    assert decode_revert(data) == ("Error", {"reason": "ERC20: boom"})


def test_decode_revert_decodes_arithmetic_panic() -> None:
    data = error_data("Panic(uint256)", ["uint256"], [0x11])
    assert decode_revert(data) == ("Panic", {"code": "0x11", "meaning": "arithmetic overflow or underflow"})


def test_decode_revert_names_unknown_panic_codes() -> None:
    data = error_data("Panic(uint256)", ["uint256"], [0x99])
    assert decode_revert(data) == ("Panic", {"code": "0x99", "meaning": "unknown"})


def test_decode_revert_returns_unknown_selector_as_data() -> None:
    data = error_data("NotOurs(uint256)", ["uint256"], [1])
    assert decode_revert(data) == ("UnknownError", {"data": data})


def test_decode_revert_handles_empty_and_short_data() -> None:
    assert decode_revert(b"") == ("EmptyRevert", {})
    assert decode_revert(b"\x01\x02") == ("EmptyRevert", {"data": b"\x01\x02"})


def test_decode_revert_decodes_the_slot_errors_with_their_slot() -> None:
    root, node = keccak(text="batch"), "0x" + "cd" * 20
    types = ["uint256", "address", "uint256", "bytes32"]
    for error in ("SlotInUse", "BatchNotFound"):
        name, values = decode_revert(error_data(f"{error}(uint256,address,uint256,bytes32)", types, [3, node, 7, root]))
        assert name == error
        assert values.keys() == {"poolId", "node", "slot", "root"}
        assert (values["poolId"], values["slot"], values["root"]) == (3, 7, root)


def test_decode_revert_reports_truncated_custom_error() -> None:
    types = ["uint256", "address", "uint256", "bytes32"]
    values = [1, "0x" + "00" * 20, 0, b"\x00" * 32]
    data = error_data("SlotInUse(uint256,address,uint256,bytes32)", types, values)[:-16]
    name, values = decode_revert(data)
    assert name == "UndecodableRevert"
    assert values["data"] == data
    assert values["problem"]
