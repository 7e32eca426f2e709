"""The coordinator API's routes (DESIGN section 8) and the size limits both ends hold its messages to.

| route | who | what |
|---|---|---|
| `GET /v1/pool`, `GET /v1/step` | anyone | the pool's id, trainer and current policy step |
| `GET /v1/steps` | anyone | when each recent step became current (validators judge staleness at submission time) |
| `POST /v1/tasks` | signed, a pool member | the next assignment for the signing node (503 `no_work`) |
| `PUT /v1/rollouts/{sha256}` | signed, a member | upload a rollout file; content-addressed, idempotent, receipted |
| `GET /v1/rollouts/{sha256}` | anyone | download an uploaded file (validators); 410 `lost`: stored, then lost |
| `GET /v1/rollouts/{sha256}/attestations` | anyone | the signed verdicts validators posted on that file |
| `PUT /v1/batches/{root}` | signed, a member | upload a batch's leaf list (`protocol.batches`) by its root, receipted |
| `GET /v1/batches/{root}` | anyone | download a leaf list (validators); 410 `lost`: stored, then lost |
| `POST /v1/attestations` | signed, a validator | a signed verdict on a work key |
| `GET /metrics` | anyone | Prometheus text |

A signed request carries the EIP-712 `Request` headers of `protocol.signing.sign_request` over the exact path and body.
A leaf list is stored only when its leaves hash to the root its path names (400 `root_mismatch`) and the coordinator
holds every file it names (409 `missing_files`), so a receipted batch is one whose files were all available; a second
upload of a held root stores nothing (200) and is receipted for its signer too.
"""

from __future__ import annotations

import re

POOL = "/v1/pool"
STEP = "/v1/step"
STEPS = "/v1/steps"
TASKS = "/v1/tasks"
ROLLOUT = "/v1/rollouts/{sha256}"  # aiohttp's pattern; `rollout` fills it in
ROLLOUT_ATTESTATIONS = "/v1/rollouts/{sha256}/attestations"
ATTESTATIONS = "/v1/attestations"
BATCH = "/v1/batches/{root}"  # aiohttp's pattern; `batch` fills it in
METRICS = "/metrics"

TASK_REQUEST_BODY = b"{}"  # what a node posts to TASKS: the coordinator chooses everything
MAX_ANSWER_BYTES = 64 * 1024  # a JSON answer of the coordinator, at most; a client reads no more
MAX_ANSWER_DEPTH = 4  # the answers nest at most 3 deep (`GET /v1/steps`)
MAX_REQUEST_DEPTH = 2  # a JSON request body nests at most 1 deep (`POST /v1/attestations`)

_SHA256 = re.compile(r"[0-9a-f]{64}")


def rollout(work_key: bytes) -> str:
    """The path of a rollout file: its work key, the sha256 of its bytes, in 64 lower-case hex digits."""
    return f"/v1/rollouts/{work_key.hex()}"


def rollout_attestations(work_key: bytes) -> str:
    return f"/v1/rollouts/{work_key.hex()}/attestations"


def batch(root: bytes) -> str:
    """The path of a batch's leaf list: its Merkle root (`ledger.merkle`), in 64 lower-case hex digits."""
    return f"/v1/batches/{root.hex()}"


def work_key_of(name: str) -> bytes | None:
    """The work key a route's `{sha256}` names, or None unless it is exactly 64 lower-case hex digits."""
    return bytes.fromhex(name) if _SHA256.fullmatch(name) else None


def root_of(name: str) -> bytes | None:
    """The Merkle root a route's `{root}` names, or None unless it is exactly 64 lower-case hex digits."""
    return work_key_of(name)  # one form for both 32-byte names
