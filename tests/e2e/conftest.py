"""The fixture of the end-to-end tests: every process a test starts is killed when it ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.running import Processes


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    try:
        yield running
    finally:
        running.stop_all()
