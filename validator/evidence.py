"""What a validator keeps of every rejection until its challenge window closes, so the verdict can be re-checked.

A slashed worker, or the operator, must be able to see exactly why, and to have the verdict recomputed: the
trainer and the relays prune checkpoints after a few steps, so without this nothing could be re-verified once a
slash was disputed (issue 17). For each rejected file `<state>/evidence/<work key>/` holds:

- `file.parquet`: the bytes that were judged;
- `record.json`: the verdict (with every failing row's per-chunk statistics against the thresholds, from both
  routes of `validator.recompute`), what the chain said of the submission, the settings it was judged by, the
  task spec's path and hash, and the checkpoint's step, model hash and signed manifest hash;

and `<state>/evidence/checkpoints/step_<N>/` the checkpoint of every step a kept file was judged with (hard links
into the validator's checkpoint folder where the file system allows, so keeping it costs no copy). A file that is a
leaf of a batch keeps, in its record, the batch's root and slot and the leaf's Merkle proof, as its invalidation sent
it.
A batch whose leaf list itself condemned it (`validator.batches`) keeps `<state>/evidence/batches/<root>/`: the list
as the coordinator served it (`leaves.bin`, absent when it was never made available) and `record.json`. Everything
is pruned once the last challenge window it backs has closed. `prime-validate explain` reads it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.proofs import ProofThresholds
from ledger.merkle import LeafProof
from protocol.rollouts.writer import publish_atomically
from protocol.signing import SigningDomain
from protocol.terms import AssignmentTiming
from validator.config import ValidatorConfig
from validator.errors import ValidatorError
from validator.slots import SlotBatch
from validator.verdict import Verdict
from validator.verify import Expected

EVIDENCE_DIR = "evidence"
FILE_NAME, RECORD_NAME = "file.parquet", "record.json"
BATCHES_DIR, LEAVES_NAME = "batches", "leaves.bin"


def proof_json(root: bytes, proof: LeafProof, *, slot: int) -> dict[str, Any]:
    """A leaf's Merkle proof as evidence keeps it, with the node's batch slot that held the batch: enough to send
    `invalidateBatch` again by hand (it names the batch by slot and root)."""
    return {
        "root": "0x" + root.hex(),
        "slot": slot,
        "index": proof.index,
        "work_key": "0x" + proof.leaf.work_key.hex(),
        "units": proof.leaf.units,
        "siblings": ["0x" + sibling.hex() for sibling in proof.siblings],
    }


class EvidenceMissing(ValidatorError):
    """No kept evidence for a work key (never rejected here, or pruned after its window closed)."""


@dataclass(frozen=True)
class Kept:
    """One rejection's evidence, read back."""

    work_key: bytes
    data: bytes
    record: dict[str, Any]
    checkpoint: Path | None  # None: the file was rejected before any checkpoint was needed

    @property
    def verdict(self) -> dict[str, Any]:
        return dict(self.record["verdict"])

    def config(self) -> ValidatorConfig:
        settings = dict(self.record["config"])
        settings["thresholds"] = ProofThresholds(**settings["thresholds"])
        return ValidatorConfig(**settings)

    def expected(self) -> Expected:
        fields = dict(self.record["expected"])
        work_key = fields.pop("work_key")
        if isinstance(domain := fields.get("domain"), dict):  # the signing domain of the assignment signature
            fields["domain"] = SigningDomain(int(domain["chain_id"]), str(domain["verifying_contract"]))
        if isinstance(timing := fields.get("timing"), dict):  # the pool's assignment lifetime and clock slack
            fields["timing"] = AssignmentTiming(int(timing["lifetime"]), int(timing["clock_slack"]))
        return Expected(work_key=bytes.fromhex(work_key.removeprefix("0x")) if work_key else None, **fields)


class Evidence:
    """`<state>/evidence`: written by the daemon at each rejection, read by `prime-validate explain`."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / EVIDENCE_DIR

    def keep(
        self,
        data: bytes,
        verdict: Verdict,
        *,
        expected: Expected,
        config: ValidatorConfig,
        task: Path | None,
        task_hash: bytes,
        kept_until: float,
        step: int | None = None,
        checkpoint: Path | None = None,
        manifest_hash: bytes | None = None,
        batch: tuple[SlotBatch, LeafProof] | None = None,
    ) -> Path:
        """Writes one rejection's folder (file first, record last: a folder without its record is not evidence);
        `batch` is the batch the file is a leaf of (its slot and root) and the leaf's proof."""
        if expected.work_key is None:
            raise ValueError("evidence is kept by work key: Expected.work_key is needed")
        folder = self.root / expected.work_key.hex()
        folder.mkdir(parents=True, exist_ok=True)
        publish_atomically(folder / FILE_NAME, data)
        kept_checkpoint = None
        if checkpoint is not None and step is not None:
            kept_checkpoint = self._keep_checkpoint(checkpoint, step)
        record = {
            "work_key": "0x" + expected.work_key.hex(),
            "kept_at": time.time(),
            "kept_until": kept_until,
            "expected": dataclasses.asdict(expected) | {"work_key": "0x" + expected.work_key.hex()},
            "config": {k: v for k, v in dataclasses.asdict(config).items() if k not in ("origins", "file")},
            "task": None if task is None else str(task),
            "task_hash": "0x" + task_hash.hex(),
            "step": step,
            "checkpoint": None if kept_checkpoint is None else kept_checkpoint.name,
            "manifest_hash": None if manifest_hash is None else "0x" + manifest_hash.hex(),
            "verdict": verdict.to_dict(),
            "batch": None if batch is None else proof_json(batch[0].root, batch[1], slot=batch[0].slot),
        }
        publish_atomically(folder / RECORD_NAME, json.dumps(record, indent=2, allow_nan=False).encode())
        return folder

    def keep_batch(
        self,
        root: bytes,
        *,
        slot: int,
        node: str,
        leaves: bytes | None,
        reason: int,
        detail: str,
        proof: LeafProof | None,
        kept_until: float,
    ) -> Path:
        """Writes the evidence of `node`'s batch `root` in its slot `slot`, which its leaf list condemned: the list as
        served (None: never made available), the reason, and the proof its invalidation sends (None:
        `invalidateUnavailableBatch`, no proof)."""
        folder = self.root / BATCHES_DIR / root.hex()
        folder.mkdir(parents=True, exist_ok=True)
        if leaves is not None:
            publish_atomically(folder / LEAVES_NAME, leaves)
        record = {
            "root": "0x" + root.hex(),
            "slot": slot,
            "node": node,
            "kept_at": time.time(),
            "kept_until": kept_until,
            "reason": reason,
            "detail": detail,
            "proof": None if proof is None else proof_json(root, proof, slot=slot),
        }
        publish_atomically(folder / RECORD_NAME, json.dumps(record, indent=2, allow_nan=False).encode())
        return folder

    def _keep_checkpoint(self, checkpoint: Path, step: int) -> Path:
        target = self.root / "checkpoints" / f"step_{step}"
        if target.is_dir():
            return target
        staging = target.with_name(f".{target.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(checkpoint, staging, copy_function=_link_or_copy)
        staging.rename(target)
        return target

    def load(self, work_key: bytes) -> Kept:
        folder = self.root / work_key.hex()
        try:
            record = json.loads((folder / RECORD_NAME).read_text())
            data = (folder / FILE_NAME).read_bytes()
        except FileNotFoundError:
            raise EvidenceMissing(
                f"no evidence kept for 0x{work_key.hex()} in {self.root}: this validator did not reject it, or its "
                "challenge window closed and the evidence was pruned"
            ) from None
        except (OSError, ValueError) as exc:
            raise ValidatorError(f"the evidence of 0x{work_key.hex()} in {folder} is unreadable: {exc}") from None
        name = record.get("checkpoint")
        checkpoint = None if name is None else self.root / "checkpoints" / name
        return Kept(work_key, data, record, checkpoint)

    def prune(self, now: float) -> list[bytes]:
        """Drops the evidence whose window has closed, then every kept checkpoint no remaining record needs."""
        if not self.root.is_dir():
            return []
        dropped, needed = [], set()
        batches = self.root / BATCHES_DIR
        if batches.is_dir():
            for folder in batches.iterdir():
                with contextlib.suppress(OSError, ValueError, KeyError):  # being written or damaged: left alone
                    if float(json.loads((folder / RECORD_NAME).read_text())["kept_until"]) < now:
                        shutil.rmtree(folder, ignore_errors=True)
        for folder in self.root.iterdir():
            if folder.name in ("checkpoints", BATCHES_DIR) or not folder.is_dir():
                continue
            try:
                record = json.loads((folder / RECORD_NAME).read_text())
            except (OSError, ValueError):
                continue  # being written, or damaged: a person should look, not a pruner
            if float(record["kept_until"]) < now:
                shutil.rmtree(folder, ignore_errors=True)
                dropped.append(bytes.fromhex(folder.name))
            elif record.get("checkpoint"):
                needed.add(record["checkpoint"])
        checkpoints = self.root / "checkpoints"
        if checkpoints.is_dir():
            for kept in checkpoints.iterdir():
                if kept.name not in needed and not kept.name.startswith("."):
                    shutil.rmtree(kept, ignore_errors=True)
        return dropped


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, target)
