"""Each setting is declared once: every key of the three shipped config files, set or shown commented out, maps to
exactly one declared field of its role's settings type (core/config.py), and every declared field is shown in its
file. A key documented in a file but read by nothing, or a field no file shows, fails here by name."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from core.config import Settings, declared
from node.config import WorkerSettings
from trainer.config import TrainerSettings
from validator.settings import ValidatorSettings

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# `key = value` or `# key = value` (a documented optional key), the value a TOML literal, then perhaps a comment;
# `[table]` or `# [table]` starts a table
KEY = re.compile(r'^#?\s?([a-z][a-z0-9_]*)\s*=\s*("[^"]*"|\[.*\]|true|false|[-+0-9.eE_]+|nan|inf)\s*(#.*)?$')
TABLE = re.compile(r"^#?\s{0,1}\[([a-z][a-z0-9_.]*)\]")


def shown_keys(path: Path) -> list[str]:
    """The dotted keys a config file sets or shows commented out, in order (repeats kept)."""
    keys, table = [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if found := TABLE.match(line):
            table = found.group(1)
            keys.append(table)  # a table is a key of the table around it
        elif found := KEY.match(line):
            keys.append(f"{table}.{found.group(1)}" if table else found.group(1))
    return keys


def declared_keys(cls: type[Settings], prefix: str = "") -> list[str]:
    """Every dotted key `cls` declares, its tables and theirs included."""
    keys = []
    for item in declared(cls):
        dotted = f"{prefix}.{item.key}" if prefix else item.key
        keys.append(dotted)
        if item.is_table:
            keys += declared_keys(item.kind, dotted)
    return keys


ROLES: list[tuple[str, type[Settings]]] = [
    ("node.toml", WorkerSettings),
    ("validator.toml", ValidatorSettings),
    ("trainer.toml", TrainerSettings),
]


@pytest.mark.parametrize(("name", "cls"), ROLES)
def test_every_key_of_the_shipped_file_is_declared_once_and_every_declaration_is_shown(
    name: str, cls: type[Settings]
) -> None:
    own = [f"{cls.TABLE}.{key}" if cls.TABLE else key for key in declared_keys(cls)]
    if cls.TABLE:
        own.insert(0, cls.TABLE)
    twice = [key for key, n in Counter(own).items() if n > 1]
    assert not twice, f"{cls.__name__} declares {twice} more than once"
    shown = shown_keys(CONFIGS / name)
    assert shown, f"no keys found in {name}"
    unknown = sorted(set(shown) - set(own))
    assert not unknown, f"{name} shows keys {cls.__name__} does not declare: {unknown}"
    unshown = [key for key in own if key not in shown]
    assert not unshown, f"{cls.__name__} declares keys {name} does not show: {unshown}"
    repeated = [key for key, n in Counter(shown).items() if n > 1]
    assert not repeated, f"{name} shows {repeated} twice"


def test_the_key_reader_sees_set_and_commented_keys_and_tables_but_not_prose(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text("# a = b is prose\nlone = 1\n[run]\nsteps = 3   # c = d\n# seed = 0\n# [p2p]\n# port = 0\n")
    assert shown_keys(path) == ["lone", "run", "run.steps", "run.seed", "p2p", "p2p.port"]


def test_a_key_no_settings_type_declares_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text((CONFIGS / "node.toml").read_text() + "# gpu_layers = 4  # a key nobody reads\n")
    assert "worker.gpu_layers" in set(shown_keys(path)) - {f"worker.{k}" for k in declared_keys(WorkerSettings)}
