"""Deterministic problem assignment: which problems a node must solve for (pool, step, counter).

A worker that could choose its problems would pick easy ones (high reward, little training signal) or ones it has
cached answers for. So the problems are a pure function of public inputs, keyed by the node's own address: the
worker cannot influence them, and a validator recomputes them and rejects a file with any other problem
(reason 3, wrong assignment).

The draw is a partial Fisher-Yates shuffle of range(num_problems) whose random numbers come from
sha256(domain, pool id, node address, step, counter, position, attempt): an exactly uniform sample of `n` distinct
indices in O(n) time and memory, whatever the number of problems.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from protocol.tasks.errors import AssignmentError

ASSIGN_DOMAIN = b"prime-node/assign/v1"
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_U64 = 1 << 64
_U256 = 1 << 256


def assign(pool_id: int, node: str, step: int, counter: int, n: int, num_problems: int) -> list[int]:
    """`n` distinct indices into a task's problem list, in draw order.

    Requirements: `node` is a 0x-prefixed 20-byte hex address (any case: "0xAB.." and "0xab.." are the same node);
    0 <= pool_id < 2**256; 0 <= step, counter < 2**64; 0 <= n <= num_problems.
    """
    key = assignment_key(pool_id, node, step, counter)
    if num_problems < 1:
        raise AssignmentError(f"a task needs at least one problem, got num_problems={num_problems}")
    if not 0 <= n <= num_problems:
        raise AssignmentError(f"cannot draw n={n} distinct problems from num_problems={num_problems}")
    moved: dict[int, int] = {}  # position -> index, for the positions the shuffle has touched
    drawn: list[int] = []
    for position in range(n):
        target = position + _uniform_below(key, position, num_problems - position)
        chosen = moved.get(target, target)
        moved[target] = moved.get(position, position)
        drawn.append(chosen)
    return drawn


def assign_problem_ids(
    problem_ids: Sequence[str], pool_id: int, node: str, step: int, counter: int, n: int
) -> list[str]:
    """`assign` mapped through a source's stable id list (`TaskSource.problem_ids()`)."""
    return [problem_ids[i] for i in assign(pool_id, node, step, counter, n, len(problem_ids))]


def assignment_key(pool_id: int, node: str, step: int, counter: int) -> bytes:
    """The fixed-width encoding of the inputs, so that no two input tuples share a key."""
    if not isinstance(node, str) or not _ADDRESS.fullmatch(node):
        raise AssignmentError(f"node must be a 0x-prefixed 20-byte hex address, got {node!r}")
    if not 0 <= pool_id < _U256:
        raise AssignmentError(f"pool_id must be a uint256, got {pool_id}")
    for name, value in (("step", step), ("counter", counter)):
        if not 0 <= value < _U64:
            raise AssignmentError(f"{name} must be a uint64, got {value}")
    return (
        ASSIGN_DOMAIN
        + pool_id.to_bytes(32, "big")
        + bytes.fromhex(node[2:].lower())
        + step.to_bytes(8, "big")
        + counter.to_bytes(8, "big")
    )


def _uniform_below(key: bytes, position: int, bound: int) -> int:
    """An unbiased integer in [0, bound): a 256-bit hash, redrawn in the (astronomically rare) biased tail."""
    limit = _U256 - _U256 % bound
    attempt = 0
    while True:
        digest = hashlib.sha256(key + position.to_bytes(8, "big") + attempt.to_bytes(4, "big")).digest()
        value = int.from_bytes(digest, "big")
        if value < limit:
            return value % bound
        attempt += 1
