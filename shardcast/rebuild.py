"""A receiver's side of delta checkpoints: which held step a delta can start from, and the files it rebuilds.

A receiver keeps, in each checkpoint folder it fetched, the trainer-signed manifest the folder was fetched by
(`SIGNED_MANIFEST_NAME`). A format-3 manifest's delta names its base by the hash of that manifest, so `held_bases`
finds the folder a delta applies to without trusting anything but the receiver's own earlier verification.

`apply_link` applies one step's deltas to the files of the step before it and keeps only the results whose shards
hash to that step's manifest: a delta made against other bytes, or a base that changed on disk, gives files that are
dropped here and fetched whole later. Nothing here trusts a delta: the final step's files are written into the
receiver's `PartialCheckpoint` through its verified paths (`PartialCheckpoint.take_file`), and the checkpoint is
published only once every shard verified, exactly as when it is fetched whole.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from shardcast.delta import DeltaError, apply_delta
from shardcast.manifest import Manifest, delta_name
from shardcast.partial import PartialCheckpoint, bad_shards

log = logging.getLogger(__name__)

SIGNED_MANIFEST_NAME = ".shardcast-signed-manifest.json"  # in a fetched checkpoint's folder: the manifest it matched
APPLIED_SUFFIX = ".applied"  # a file rebuilt from its delta, beside the delta, until it is taken into the checkpoint


def held_bases(root: Path, prefix: str) -> dict[bytes, Path]:
    """The checkpoint folders `<root>/<prefix><N>` that keep their signed manifest, by that manifest's hash."""
    held: dict[bytes, Path] = {}
    for folder in root.glob(f"{prefix}*"):
        marker = folder / SIGNED_MANIFEST_NAME
        if folder.name[len(prefix) :].isdigit() and marker.is_file():
            held[hashlib.sha256(marker.read_bytes()).digest()] = folder
    return held


def apply_link(
    manifest: Manifest, deltas: Path, current: dict[str, Path], *, verify: bool = True
) -> tuple[dict[str, Path], list[str]]:
    """Apply `manifest`'s deltas (the files in folder `deltas`) to `current` (name -> the base step's file), writing
    each result beside its delta; returns (name -> rebuilt file, what went wrong). With `verify`, a result whose shards
    do not all hash to the manifest is dropped (a receiver's last link is verified shard by shard as it is taken
    instead, so that a file of which some shards are right keeps them)."""
    assert manifest.delta is not None
    rebuilt: dict[str, Path] = {}
    problems: list[str] = []
    for name in manifest.delta.targets:
        mf = manifest.file(name)
        if name not in current or mf is None:
            continue
        out = deltas / (name + APPLIED_SUFFIX)
        try:
            apply_delta(current[name], deltas / delta_name(name), out, size=mf.size)
        except (DeltaError, OSError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        if verify and (bad := bad_shards(out, mf)):
            problems.append(f"{name} of step {manifest.step}: {len(bad)} shards rebuilt from the delta do not verify")
            out.unlink()
            continue
        rebuilt[name] = out
    for problem in problems:
        log.warning("delta of step %d: %s", manifest.step, problem)
    return rebuilt, problems


def base_files(manifest: Manifest, folder: Path) -> dict[str, Path]:
    """The checkpoint files of a held step, as deltas' bases."""
    return {f.name: folder / f.name for f in manifest.checkpoint_files if (folder / f.name).is_file()}


def take_rebuilt(sink: PartialCheckpoint, rebuilt: dict[str, Path]) -> tuple[int, list[str]]:
    """Take each rebuilt file into `sink` (`PartialCheckpoint.take_file`: only shards that verify); returns the bytes
    taken and, per file, how many of its shards did not verify (they stay missing, to be downloaded whole)."""
    taken, problems = 0, []
    for name, path in rebuilt.items():
        taken += sink.take_file(name, path)
        if left := sum(1 for file, _ in sink.missing() if file == name):
            problems.append(f"{name}: {left} shards rebuilt from the delta did not verify")
    return taken, problems
