"""`prime-devnet up` refuses settings it cannot run with one line, before it starts anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from devnet.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "1", "--cheater"], "--cheater needs at least 2 workers"),
        (["--model", "no-such-model"], "is not a model folder"),
    ],
)
def test_settings_it_cannot_run_are_refused_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["up", "--dir", str(tmp_path / "run"), *args])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started
