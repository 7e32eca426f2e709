"""docs/threat-model.md names, for each attack, the tests that pin what stops it: every one of them must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def test_every_test_the_threat_model_names_exists() -> None:
    text = (ROOT / "docs" / "threat-model.md").read_text()
    references = REFERENCE.findall(text)
    assert len(references) > 100  # the table's shape: a reference a row, most rows pinned
    missing = [
        f"{path}::{name}"
        for path, name in references
        if not (ROOT / path).is_file() or not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.M)
    ]
    assert not missing, missing
