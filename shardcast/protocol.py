"""SHARDCAST's wire protocol: the routes a relay or origin serves, the header that carries a manifest's signature,
and the one JSON message (the version list), written by the server and read strictly by the client. Both sides import
this and nothing of each other (docs/shardcast.md).

    GET /versions[?after=STEP&wait=SECONDS]        the version list; with `after`, held up to `wait` s for a newer one
    GET /v/STEP/manifest.json                       the manifest, its trainer signature in X-Shardcast-Signature
    GET /v/STEP/shards/FILE/INDEX                   one shard's bytes (ranges allowed)
    GET /health, GET /metrics                       liveness; Prometheus text

A step is written in canonical decimal (no sign, no leading zero): one URL per step, so a cache or a relay never
holds the same shard twice under two names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

VERSIONS = "/versions"
MANIFEST = "/v/{step}/manifest.json"
SHARD = "/v/{step}/shards/{file}/{index}"
HEALTH = "/health"
METRICS = "/metrics"

SIGNATURE_HEADER = "X-Shardcast-Signature"  # "0x" + the trainer's EIP-712 signature over the manifest (shardcast.trust)
MAX_VERSIONS_BYTES = 1024 * 1024  # the largest version list a client reads
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # the largest manifest a client reads
STEP = re.compile(r"0|[1-9][0-9]{0,19}")  # canonical decimal


def versions_url(base: str) -> str:
    return base + VERSIONS


def manifest_url(base: str, step: int) -> str:
    return base + MANIFEST.format(step=step)


def shard_url(base: str, step: int, file: str, index: int) -> str:
    return base + SHARD.format(step=step, file=file, index=index)  # file: a manifest name (shardcast.manifest)


@dataclass(frozen=True)
class VersionList:
    """What a source holds: `complete` versions it serves whole, `incoming` ones it is still receiving (served as
    far as they go), and the newest complete step (`latest`, None when there is none)."""

    latest: int | None
    complete: frozenset[int]
    incoming: frozenset[int]

    @property
    def steps(self) -> frozenset[int]:
        return self.complete | self.incoming

    def to_json(self) -> dict[str, object]:
        steps = sorted(self.steps)
        return {"latest": self.latest, "versions": [{"step": s, "complete": s in self.complete} for s in steps]}


def read_versions(body: bytes) -> VersionList:
    """The version list a source sent; raises ValueError naming what is wrong (depth, types, a step that is not one).
    The caller bounds the body (`MAX_VERSIONS_BYTES`) and its nesting before this parses it."""
    try:
        raw = json.loads(body)
        complete = {_step(v["step"]) for v in raw["versions"] if v["complete"] is True}
        incoming = {_step(v["step"]) for v in raw["versions"] if v["complete"] is False}
        latest = None if raw["latest"] is None else _step(raw["latest"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a version list ({type(exc).__name__}: {exc})") from None
    return VersionList(latest, frozenset(complete), frozenset(incoming))


def _step(value: object) -> int:
    if type(value) is not int or not 0 <= value < 2**64:
        raise ValueError(f"not a step: {value!r:.40}")
    return value
