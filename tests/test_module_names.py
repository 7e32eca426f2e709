"""The tests have no packages (tests/ has no __init__.py files): pytest imports each module by its basename, so two
test modules with one name break the whole suite's collection ("import file mismatch"), which a run of one folder
never shows. This keeps every test module's name unique, in the fast lane."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_modules_share_a_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "node_modules" not in path.parts:
            by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
    assert len(by_name) > 100  # the walk found the suite
