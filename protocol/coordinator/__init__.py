"""The coordinator protocol (DESIGN section 8): what the trainer's coordinator and the nodes say to each other.

Both ends import it: the client (`protocol/coordinator/client.py`) and the server (`trainer/api.py`, over the service in
`trainer/coordinator.py`). Nothing here does IO.

- `routes`: the paths, the size and depth limits of a message;
- `errors`: the refusal codes and their HTTP statuses, the error body, `ProtocolError`;
- `fields`: strict readers of one field of hostile JSON;
- `pool`: the pool's state, the step history and assignments (`PoolInfo`, `StepInfo`, `PublishedStep`,
  `StepHistory`, `TaskGrant`);
- `rollouts`: uploads and verdicts (`Upload`, `BatchUpload`, `AttestationBody`, `AttestationRecord`,
  `AttestationList`, `Recorded`, `Verdict`).
"""

from protocol.coordinator.errors import STATUS, ErrorBody, ErrorCode, ProtocolError
from protocol.coordinator.pool import PoolInfo, PublishedStep, StepHistory, StepInfo, TaskGrant
from protocol.coordinator.rollouts import (
    AttestationBody,
    AttestationList,
    AttestationRecord,
    BatchUpload,
    Recorded,
    Upload,
    Verdict,
)

__all__ = [
    "STATUS",
    "AttestationBody",
    "AttestationList",
    "AttestationRecord",
    "BatchUpload",
    "ErrorBody",
    "ErrorCode",
    "PoolInfo",
    "ProtocolError",
    "PublishedStep",
    "Recorded",
    "StepHistory",
    "StepInfo",
    "TaskGrant",
    "Upload",
    "Verdict",
]
