"""The evidence of a rejection: kept with the checkpoint, re-verified by `prime-validate explain`, pruned after
its window."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.generate import Generated
from engine.model.loading import LoadedModel
from protocol.rollouts import encode_rollouts, work_units
from protocol.tasks.spec import TaskSpec, spec_hash
from validator.cli import app
from validator.config import ValidatorConfig
from validator.evidence import Evidence, EvidenceMissing
from validator.verdict import Verdict
from validator.verify import Expected

NODE = "0x90F8bf6A479f320ead074411a4B0e7944Ea8c9C1"


@pytest.fixture(scope="module")
def stale_file(generate: Callable[..., Generated], checkpoint: LoadedModel) -> bytes:
    stale = generate(counter=41, prompts=2, group=4, model="m0_step")  # a step behind, claiming the checkpoint
    return encode_rollouts(dataclasses.replace(stale.meta, model_hash=checkpoint.model_hash), stale.rows)


def keep(
    state: Path, data: bytes, verdict: Verdict, spec: TaskSpec, checkpoint_dir: Path | None, kept_until: float
) -> bytes:
    key = hashlib.sha256(data).digest()
    Evidence(state).keep(
        data,
        verdict,
        expected=Expected(work_key=key, node=NODE, pool_id=0),
        config=ValidatorConfig(),
        task=spec.path,
        task_hash=spec_hash(spec),
        kept_until=kept_until,
        step=0,
        checkpoint=checkpoint_dir,
        manifest_hash=b"\x07" * 32,
    )
    return key


def test_explain_re_verifies_a_kept_proof_rejection_and_prints_every_chunk(
    tmp_path: Path,
    stale_file: bytes,
    verify: Callable[..., Verdict],
    task_spec: TaskSpec,
    model_dirs: dict[str, Path],
) -> None:
    key = hashlib.sha256(stale_file).digest()
    verdict = verify(stale_file, work_key=key, node=NODE, pool_id=0)
    assert not verdict.accepted
    keep(tmp_path, stale_file, verdict, task_spec, model_dirs["m0"], kept_until=time.time() + 3600)
    result = CliRunner().invoke(app, ["explain", "0x" + key.hex(), "--state", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "the re-verification agrees" in result.output
    assert f"rejected, {verdict.reason.name.lower()}" in result.output  # type: ignore[union-attr]
    assert "alone, float64" in result.output and "chunk 0: exponent mismatches" in result.output
    as_json = json.loads(
        CliRunner().invoke(app, ["explain", "0x" + key.hex(), "--state", str(tmp_path), "--json"]).stdout
    )
    assert as_json["holds"] and as_json["kept"]["manifest_hash"] == "0x" + "07" * 32
    assert as_json["reverified"]["evidence"]["rechecked"][0]["clear"]


def test_explain_says_when_the_kept_verdict_does_not_hold(
    tmp_path: Path, generate: Callable[..., Generated], verify: Callable[..., Verdict], task_spec: TaskSpec,
    model_dirs: dict[str, Path],
) -> None:  # fmt: skip
    honest = generate(counter=42, prompts=2, group=2)
    data = encode_rollouts(honest.meta, honest.rows)
    wrong = verify(data, units=work_units(honest.rows) + 1)  # rejected for units the kept chain facts do not claim
    assert not wrong.accepted
    key = keep(tmp_path, data, wrong, task_spec, model_dirs["m0"], kept_until=1e12)
    result = CliRunner().invoke(app, ["explain", "0x" + key.hex(), "--state", str(tmp_path)])
    assert result.exit_code == 1 and "THE RE-VERIFICATION DISAGREES" in result.output, result.output


def test_evidence_and_its_checkpoint_go_once_the_window_has_closed(
    tmp_path: Path, stale_file: bytes, verify: Callable[..., Verdict], task_spec: TaskSpec, model_dirs: dict[str, Path]
) -> None:
    verdict = verify(stale_file)
    key = keep(tmp_path, stale_file, verdict, task_spec, model_dirs["m0"], kept_until=time.time() - 1)
    kept = Evidence(tmp_path).load(key)
    assert kept.checkpoint is not None and (kept.checkpoint / "model.safetensors").is_file()
    assert Evidence(tmp_path).prune(time.time()) == [key]
    with pytest.raises(EvidenceMissing, match="pruned"):
        Evidence(tmp_path).load(key)
    assert not kept.checkpoint.exists()
    assert (model_dirs["m0"] / "model.safetensors").is_file()  # the validator's own copy is untouched


def test_explain_of_an_unknown_work_key_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["explain", "0x" + "ab" * 32, "--state", str(tmp_path)])
    assert result.exit_code == 2 and "no evidence kept" in result.output


def test_explain_re_verifies_a_bfloat16_pools_rejection_in_bfloat16_on_this_machines_device(
    tmp_path: Path, task_spec: TaskSpec, model_dirs: dict[str, Path]
) -> None:
    # judged by a bfloat16 validator on a GPU; explained here, where there may be none: the kept precision, this device
    import torch

    from engine.generate import generate_rollouts
    from engine.inference.torch_backend import TorchBackend
    from engine.model.loading import load_model
    from protocol.plan import Job
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from validator.verify import verify_file

    text = task_spec.path.read_text()
    assert "max_tokens = 64\n" in text
    bf16_task = tmp_path / "bf16.toml"
    bf16_task.write_text(text.replace("max_tokens = 64\n", 'max_tokens = 64\ndtype = "bfloat16"\n'))
    spec = load_task_spec(bf16_task)
    source = open_source(spec)
    stale = load_model(model_dirs["m0_step"], dtype=torch.bfloat16)  # a step behind, claiming the checkpoint
    checkpoint = load_model(model_dirs["m0"], dtype=torch.bfloat16)
    job = Job(pool_id=0, node=NODE, step=0, counter=43, prompts=2, group_size=4)
    made = generate_rollouts(job, spec, source, stale, TorchBackend.from_loaded(stale))
    data = encode_rollouts(dataclasses.replace(made.meta, model_hash=checkpoint.model_hash), made.rows)
    key = hashlib.sha256(data).digest()
    config = ValidatorConfig.for_precision("bfloat16", device="cuda")
    judged = dataclasses.replace(config, device="cpu")  # what a GPU validator would find, computed here
    verdict = verify_file(data, spec=spec, checkpoint=checkpoint, config=judged, source=source)
    assert not verdict.accepted
    Evidence(tmp_path / "state").keep(
        data,
        verdict,
        expected=Expected(work_key=key, node=NODE, pool_id=0),
        config=config,
        task=spec.path,
        task_hash=spec_hash(spec),
        kept_until=time.time() + 3600,
        step=0,
        checkpoint=model_dirs["m0"],
        manifest_hash=b"\x07" * 32,
    )
    result = CliRunner().invoke(app, ["explain", "0x" + key.hex(), "--state", str(tmp_path / "state")])
    assert result.exit_code == 0, result.output
    assert "the re-verification agrees" in result.output
