"""A rollout file's metadata for the tests that build files by hand (tests/protocol/test_rollouts.py,
test_parquet_bomb.py): valid, with float32-exact sampling values so that a round trip compares equal."""

from __future__ import annotations

from typing import Any

from protocol.rollouts import RolloutMeta, SamplingMeta

NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"


def make_meta(**changes: Any) -> RolloutMeta:
    """Pool 7, node NODE, counter 2, no assignment signature; `changes` replace RolloutMeta's fields."""
    fields: dict[str, Any] = {
        "pool_id": 7,
        "node": NODE,
        "manifest_hash": bytes(range(32)),
        "sampling": SamplingMeta(temperature=0.75, top_p=0.875, max_tokens=64),
        "task_spec_hash": b"\x02" * 32,
        "model_hash": b"\x03" * 32,
        "counter": 2,
        "assignment_signature": None,
        "created_by": "prime-node test",
    }
    return RolloutMeta(**(fields | changes))
