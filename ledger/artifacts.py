"""Compiled contract artifacts (ABI and bytecode) committed in contracts/artifacts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address

from ledger.errors import ArtifactError

CONTRACT_NAMES = ("StakeToken", "NodeRegistry", "ComputePool", "WorkLedger")
ARTIFACT_DIR = Path(__file__).resolve().parent.parent / "contracts" / "artifacts"

_ERROR_STRING = bytes.fromhex("08c379a0")  # Error(string)
_PANIC = bytes.fromhex("4e487b71")  # Panic(uint256)
_PANIC_CODES = {
    0x01: "assertion failed",
    0x11: "arithmetic overflow or underflow",
    0x12: "division by zero",
    0x21: "invalid enum value",
    0x31: "pop on empty array",
    0x32: "array index out of bounds",
    0x41: "out of memory",
}


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    source_hash: str
    compiler_version: str


@dataclass(frozen=True)
class ErrorSpec:
    name: str
    input_names: tuple[str, ...]
    input_types: tuple[str, ...]


@cache
def load_artifact(name: str) -> Artifact:
    """Reads contracts/artifacts/<name>.json."""
    path = ARTIFACT_DIR / f"{name}.json"
    try:
        data = json.loads(path.read_text())
        return Artifact(
            name=data["contractName"],
            abi=data["abi"],
            bytecode=data["bytecode"],
            source_hash=data["sourceHash"],
            compiler_version=data["compiler"]["version"],
        )
    except FileNotFoundError as exc:
        raise ArtifactError(f"missing contract artifact {path}; run `make contracts`") from exc
    except (KeyError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"malformed contract artifact {path}: {exc}") from exc


def _abi_type(entry: dict[str, Any]) -> str:
    """The canonical ABI type of an input, expanding tuples."""
    kind: str = entry["type"]
    if kind.startswith("tuple"):
        inner = ",".join(_abi_type(component) for component in entry["components"])
        return f"({inner}){kind[len('tuple') :]}"
    return kind


@cache
def error_table() -> dict[bytes, ErrorSpec]:
    """Selector -> custom error, over every contract's ABI (including inherited OpenZeppelin errors)."""
    table: dict[bytes, ErrorSpec] = {}
    for name in CONTRACT_NAMES:
        for entry in load_artifact(name).abi:
            if entry["type"] != "error":
                continue
            types = tuple(_abi_type(arg) for arg in entry["inputs"])
            selector = keccak(text=f"{entry['name']}({','.join(types)})")[:4]
            names = tuple(arg["name"] or f"arg{i}" for i, arg in enumerate(entry["inputs"]))
            table[selector] = ErrorSpec(entry["name"], names, types)
    return table


def decode_revert(data: bytes) -> tuple[str, dict[str, Any]]:
    """Turns revert data into (error name, {argument: value}); unknown data is returned as hex."""
    if len(data) < 4:
        return "EmptyRevert", {} if not data else {"data": data}
    selector, body = data[:4], data[4:]
    try:
        if selector == _ERROR_STRING:
            (reason,) = abi_decode(["string"], body)
            return "Error", {"reason": reason}
        if selector == _PANIC:
            (code,) = abi_decode(["uint256"], body)
            return "Panic", {"code": hex(code), "meaning": _PANIC_CODES.get(code, "unknown")}
        spec = error_table().get(selector)
        if spec is None:
            return "UnknownError", {"data": data}
        values = abi_decode(list(spec.input_types), body)
    except Exception as exc:  # eth_abi raises several unrelated types for truncated data
        return "UndecodableRevert", {"data": data, "problem": str(exc)}
    shown = [
        to_checksum_address(value) if kind == "address" else value
        for kind, value in zip(spec.input_types, values, strict=True)
    ]
    return spec.name, dict(zip(spec.input_names, shown, strict=True))
