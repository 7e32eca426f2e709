"""`prime-validate explain`: a past rejection re-verified from its kept evidence, and the numbers behind it.

The file, the settings it was judged by, what the chain said of it and the checkpoint of its step come from
`validator.evidence`; the task spec from the path recorded then (or `--task`), refused if its hash changed. The
re-verification runs `verify_file` exactly as the daemon did, so an operator or a slashed worker sees whether the
verdict holds, and for every failing row the statistics of each TOPLOC chunk against the thresholds, on both routes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from engine.model.loading import LoadedModel, load_model
from protocol.tasks.spec import load_task_spec, spec_hash
from validator.errors import ValidatorError
from validator.evidence import Kept
from validator.verdict import Outcome, Verdict, recorded_outcome
from validator.verify import verify_file


def reverify(kept: Kept, *, task: Path | None = None) -> Verdict:
    """The verdict the kept file gets now, with the kept checkpoint, settings and chain facts."""
    path = task or (Path(kept.record["task"]) if kept.record.get("task") else None)
    if path is None:
        raise ValidatorError("the evidence names no task spec; give it with --task")
    spec = load_task_spec(path)
    if "0x" + spec_hash(spec).hex() != kept.record["task_hash"]:
        raise ValidatorError(f"{path} is not the task spec the file was judged by (its hash changed); give --task")

    config = kept.config()
    if config.device != "cpu" and not torch.cuda.is_available():  # judged on a GPU, looked at here on the CPU
        config = dataclasses.replace(config, device="cpu")

    def checkpoint_of(step: int) -> LoadedModel:
        if kept.checkpoint is None or not kept.checkpoint.is_dir():
            raise ValidatorError(f"the checkpoint of step {step} was not kept with this evidence")
        return load_model(kept.checkpoint, device=config.device, dtype=getattr(torch, config.dtype))

    return verify_file(kept.data, spec=spec, checkpoint=checkpoint_of, config=config, expected=kept.expected())


def same_outcome(kept: Kept, again: Verdict) -> bool:
    then = kept.verdict
    now_reason = None if again.reason is None else int(again.reason)
    return bool(then["accepted"] == again.accepted and then["reason"] == now_reason)


def report(kept: Kept, again: Verdict) -> list[str]:
    """The lines `prime-validate explain` prints: the verdict then and now, then each failing row's chunks."""
    then, record = kept.verdict, kept.record
    lines = [
        f"work key      {record['work_key']}",
        f"node          {record['expected'].get('node')}  (pool {record['expected'].get('pool_id')})",
        f"step          {record.get('step')}  checkpoint {'kept' if kept.checkpoint else 'not needed'}"
        + (f", manifest {record['manifest_hash']}" if record.get("manifest_hash") else ""),
        f"verdict then  {_outcome(then)}: {then['detail']}",
        f"verdict now   {_outcome(again.to_dict())}: {again.detail}",
        "the re-verification agrees" if same_outcome(kept, again) else "THE RE-VERIFICATION DISAGREES",
    ]
    if recorded_outcome(then) is Outcome.BORDERLINE:  # the evidence of any version (validator.verdict.to_dict)
        lines.append(
            "borderline: refused for training and payment (refuseLeaf), never slashed (not clear on the second route)"
        )
    thresholds = then["evidence"].get("thresholds") or record["config"]["thresholds"]
    for recheck in then["evidence"].get("rechecked", []):
        lines.append(f"row {recheck['row']}: confirmed {recheck['confirmed']}, clear {recheck['clear']}")
        for side in ("first", "second"):
            lines.extend(_route_lines(recheck[side], thresholds))
    return lines


def _outcome(verdict: dict[str, Any]) -> str:
    return "accepted" if verdict["accepted"] else f"rejected, {verdict['reason_name']} ({verdict['reason']})"


def _route_lines(route: dict[str, Any], thresholds: dict[str, float]) -> list[str]:
    evidence = route.get("evidence", {})
    chunks = evidence.get("chunks") or route.get("chunks") or []
    head = f"  {route['route']}: " + ("passes" if route.get("accepted") else route.get("detail", "fails"))
    limits = (
        f"    limits: exponent mismatches <= {thresholds['max_exp_mismatches']}, mantissa mean <= "
        f"{thresholds['max_mant_err_mean']}, median <= {thresholds['max_mant_err_median']}"
    )
    rows = [
        f"    chunk {i}: exponent mismatches {c['exp_mismatches']}, mantissa mean {c['mant_err_mean']:.4g}, "
        f"median {c['mant_err_median']:.4g}, boundary entries left out {c['boundary_skipped']}"
        for i, c in enumerate(chunks)
    ]
    extra = [f"    {name} {evidence[name]:.3g}" for name in ("gap", "logprob_error") if name in evidence]
    return [head, limits, *rows, *extra] if chunks else [head, *extra]
