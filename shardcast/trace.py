"""When each piece of a checkpoint passed each stage of one process: the hop-by-hop profile of a broadcast.

Off unless the environment names a folder in `PRIME_SHARDCAST_TRACE`; each process then appends JSON lines to
`<folder>/<role>-<pid>.jsonl`: `{"t": unix seconds, "event": ..., **fields}`. `benchmarks/shardcast.py --trace`
sets it for every process of a run and prints where the time went (`summarise`). Nothing else reads it: a
trace is for measuring, never for deciding, and an event costs one line write only when tracing is on.

Events (`file`, `index` name a shard; `source` is the URL it came from):
- origin: `publish_start`, `publish_copied` (in the store's temporary folder), `publish_hashed` (manifest built),
  `published` (fsynced, renamed, listed);
- any downloader (a relay's mirror, a client): `manifest` (trusted), `shard_start` (first request), `shard_done`
  (verified; `hash_s`: seconds its sha256 took, `wait_s`: seconds before its first byte), `finish_start`,
  `finish_fsynced`, `finish_renamed`;
- a client: `rebuilt` (what it rebuilt from deltas: `bytes`, `delta_bytes`, `apply_s`, `base`, `links`), `fetched`
  (`bytes`: what it downloaded whole);
- an origin: `delta_made` or `delta_skipped` (`base`, `bytes`: the deltas' bytes) before `publish_hashed`;
- any server: `served` (the last byte of a shard answer was handed to the kernel; `waited_s`: how long the
  request waited for the shard to be mirrored, `bytes`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, TextIO

ENV = "PRIME_SHARDCAST_TRACE"

_lock = threading.Lock()
_out: TextIO | None = None
_role = "process"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def set_role(role: str) -> None:
    """Name this process's trace file (origin, relay, client); before its first event."""
    global _role
    _role = role


def event(name: str, **fields: Any) -> None:
    """Record `name` now, with `fields`; nothing when tracing is off."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    global _out
    line = json.dumps({"t": time.time(), "event": name, **fields}, separators=(",", ":"))
    with _lock:
        if _out is None:
            Path(folder).mkdir(parents=True, exist_ok=True)
            _out = open(Path(folder) / f"{_role}-{os.getpid()}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        _out.write(line + "\n")
        _out.flush()


def read(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trace file of a run: file stem (role-pid) -> its events in order."""
    return {
        path.stem: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
        for path in sorted(folder.glob("*.jsonl"))
    }
