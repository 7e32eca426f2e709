"""Issue 7, acceptance 2: a short `prime-devnet up` (3 RL steps, one cheater) through the command itself.

The same facts `make demo` shows at full length: every role runs as its own process, the trainer finishes its
steps on accepted files only, the cheater is invalidated for its faked rewards, slashed and ejected while the
honest worker keeps its stake and claims its rewards after the challenge window, the pass rate is measured
before and after, and the report, the reward curve and one log per process land in the run folder. Three steps
from a random model cannot show the pass rate rising; `make demo` (600 SFT steps, then RL) does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.model.tiny import init_model

REPO = Path(__file__).resolve().parents[2]
SLASH = 50 * 10**18

pytestmark = pytest.mark.slow


def test_a_short_devnet_trains_slashes_the_cheater_and_reports(tmp_path: Path) -> None:
    model = init_model(tmp_path / "tiny", seed=0)
    run = tmp_path / "devnet"
    command = [sys.executable, "-m", "devnet.cli", "up", "--workers", "2", "--cheater", "--steps", "3"]
    command += ["--dir", str(run), "--model", str(model), "--rollouts-per-step", "16", "--prompts-per-task", "2"]
    command += ["--group-size", "4", "--eval-problems", "16", "--eval-samples", "1", "--band", "0", "1"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((run / "logs").glob("*.log")))
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{logs}"

    out = done.stdout
    assert "devnet report" in out and "pass rate" in out and str(run / "logs") in out
    report = json.loads((run / "report.json").read_text())
    assert report["steps"] == 3
    assert 0 <= report["pass_rate_before"] <= 1 and 0 <= report["pass_rate_after"] <= 1
    nodes = {n["name"]: n for n in report["nodes"]}
    honest, cheat = nodes["worker-1"], nodes["worker-2"]
    assert cheat["cheater"] and not honest["cheater"]

    # the cheater: invalidated for reward mismatch, slashed from its provider's stake, ejected
    assert cheat["invalidated"] >= 1 and cheat["ejected"] and not cheat["member"], report
    assert report["rejected"].get("reward_mismatch (6)", 0) >= 1, report["rejected"]
    # each invalidation slashes 50 tokens while stake is left: the provider loses exactly what was slashed
    before = report["stake_before"][cheat["provider"]]
    assert cheat["slashed"] == min(cheat["invalidated"] * SLASH, before) > 0
    assert cheat["stake"] == before - cheat["slashed"]
    # the honest worker: nothing invalidated, stake intact, rewards claimed once the window passed
    assert honest["invalidated"] == 0 and honest["member"] and not honest["ejected"]
    assert honest["stake"] == report["stake_before"][honest["provider"]]
    assert report["claimed"].get(honest["provider"], 0) > 0
    assert cheat["provider"] not in report["claimed"]

    # the trainer trained only on accepted files: 3 steps of 16 completions from 8-completion files
    assert report["trained_files"] >= 3 * 2 and report["accepted"] >= report["trained_files"]
    trained = [json.loads(line) for line in (run / "run" / "trained.jsonl").read_text().splitlines()]
    assert [t["step"] for t in trained] == [1, 2, 3]

    assert (run / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("anvil", "trainer", "relay", "validator", "worker-1", "worker-2"):
        assert (run / "logs" / f"{name}.log").stat().st_size > 0, name
