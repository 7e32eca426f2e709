"""One file of work as the coordinator assigns it: the fields the grant, the signed message and the job share.

The coordinator sends them in a `TaskGrant` (`protocol.coordinator.pool`), its trainer signs them in an
`Assignment` (`protocol.signing`), and the worker and the validator plan the file from them as a `Job`
(`protocol.plan`). Each of those adds what is its own (a signature, the task's hash, the issue time) to this one
declaration, so the three never disagree on what an assignment is. Which problems it holds is
`protocol.tasks.assignment`'s to draw.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AssignedWork:
    """`node`'s assignment `counter` at policy `step` of pool `pool_id`: `prompts` x `group_size` samples."""

    pool_id: int
    node: str
    step: int
    counter: int
    prompts: int
    group_size: int
