"""The pool's public state and its assignments on the wire: `GET /v1/pool`, `/v1/step`, `/v1/steps`, `POST /v1/tasks`.

Each message is a frozen dataclass; `to_json` is what the coordinator sends, `from_json` what a node accepts,
field by field (`protocol.coordinator.fields`: a missing key, a wrong type or an out-of-range number is a
`ProtocolError` naming the field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.coordinator import fields as f
from protocol.work import AssignedWork

MAX_STEPS_LISTED = 4096  # entries of `GET /v1/steps` a client reads (the trainer keeps 1024)


@dataclass(frozen=True)
class PoolInfo:
    """`GET /v1/pool`: which pool this coordinator serves, its trainer, and the current policy step."""

    pool_id: int
    trainer: str
    step: int

    def to_json(self) -> dict[str, Any]:
        return {"pool_id": self.pool_id, "trainer": self.trainer, "step": self.step}

    @classmethod
    def from_json(cls, value: object) -> PoolInfo:
        raw = f.obj("PoolInfo", value)
        return cls(
            f.uint("PoolInfo", raw, "pool_id", f.UINT256_MAX),
            f.address("PoolInfo", raw, "trainer"),
            f.uint("PoolInfo", raw, "step", f.UINT64_MAX),
        )


@dataclass(frozen=True)
class StepInfo:
    """`GET /v1/step`: the current policy step."""

    step: int

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step}

    @classmethod
    def from_json(cls, value: object) -> StepInfo:
        return cls(f.uint("StepInfo", f.obj("StepInfo", value), "step", f.UINT64_MAX))


@dataclass(frozen=True)
class PublishedStep:
    """One entry of `GET /v1/steps`: `step` became the pool's current policy at `at` (unix seconds)."""

    step: int
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "at": self.at}

    @classmethod
    def from_json(cls, value: object) -> PublishedStep:
        raw = f.obj("PublishedStep", value)
        return cls(f.uint("PublishedStep", raw, "step", f.UINT64_MAX), f.seconds("PublishedStep", raw, "at"))


@dataclass(frozen=True)
class StepHistory:
    """`GET /v1/steps`: the recent steps and when each became current, oldest first (a bounded history)."""

    steps: tuple[PublishedStep, ...]

    def to_json(self) -> dict[str, Any]:
        return {"steps": [entry.to_json() for entry in self.steps]}

    @classmethod
    def from_json(cls, value: object) -> StepHistory:
        listed = f.items("StepHistory", f.obj("StepHistory", value), "steps", MAX_STEPS_LISTED)
        return cls(tuple(PublishedStep.from_json(entry) for entry in listed))


@dataclass(frozen=True)
class TaskGrant(AssignedWork):
    """`POST /v1/tasks`: assignment `counter` of `node` at policy `step`, `prompts` x `group_size` samples.

    With a trainer's key, `signature` is its EIP-712 signature over `protocol.signing.Assignment` of these fields,
    `task_spec_hash` and `issued_at` (unix seconds, the trainer's clock when it signed; the worker writes both into
    the file); a coordinator without one sends none of the three."""

    task_spec_hash: bytes | None = None
    signature: bytes | None = None
    issued_at: int | None = None

    def to_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "pool_id": self.pool_id,
            "node": self.node,
            "step": self.step,
            "counter": self.counter,
            "prompts": self.prompts,
            "group_size": self.group_size,
        }
        if self.task_spec_hash is not None:
            answer["task_spec_hash"] = "0x" + self.task_spec_hash.hex()
        if self.signature is not None:
            answer["signature"] = "0x" + self.signature.hex()
        if self.issued_at is not None:
            answer["issued_at"] = self.issued_at
        return answer

    @classmethod
    def from_json(cls, value: object) -> TaskGrant:
        name, raw = "TaskGrant", f.obj("TaskGrant", value)
        return cls(
            pool_id=f.uint(name, raw, "pool_id", f.UINT256_MAX),
            node=f.address(name, raw, "node"),
            step=f.uint(name, raw, "step", f.UINT64_MAX),
            counter=f.uint(name, raw, "counter", f.UINT64_MAX),
            prompts=f.uint(name, raw, "prompts", f.UINT32_MAX, minimum=1),
            group_size=f.uint(name, raw, "group_size", f.UINT32_MAX, minimum=1),
            task_spec_hash=f.optional_hex(name, raw, "task_spec_hash", 32),
            signature=f.optional_hex(name, raw, "signature", 65),
            issued_at=f.uint(name, raw, "issued_at", f.UINT64_MAX) if "issued_at" in raw else None,
        )
