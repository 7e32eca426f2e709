"""The import tower (docs/architecture.md): core <- ledger <- node <- validator, trainer; no service module imports a
CLI module; no two parts of one package import each other. Read from the source with `ast`, inline imports and
TYPE_CHECKING ones included: an import that runs back up a layer is a defect even where it happens to work."""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"core": 0, "ledger": 1, "node": 2, "validator": 3, "trainer": 3}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def graph() -> dict[str, set[tuple[str, int]]]:
    """module -> the project modules it imports, with the line."""
    modules = {module_name(p): p for pkg in LAYER for p in (ROOT / pkg).rglob("*.py")}
    edges: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                while target and target not in modules:  # `from a.b import name`: the module a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add((target, node.lineno))
    return edges


def is_cli(module: str) -> bool:
    return "cli" in module.split(".")


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{m} -> {t} (line {line})"
        for m, targets in graph().items()
        for t, line in targets
        if m.split(".")[0] != t.split(".")[0] and LAYER[t.split(".")[0]] >= LAYER[m.split(".")[0]]
    ]
    assert not upward, upward


def test_no_service_module_imports_a_cli_module() -> None:
    found = [f"{m} -> {t} (line {line})" for m, ts in graph().items() if not is_cli(m) for t, line in ts if is_cli(t)]
    assert not found, found


def test_no_two_parts_of_a_package_import_each_other() -> None:
    """node.daemon may import node.rollouts, or the other way, never both (parts: the second level of a name)."""
    part = {m: ".".join(m.split(".")[:2]) for m in graph()}
    uses: dict[str, set[str]] = defaultdict(set)
    for m, targets in graph().items():
        for t, _ in targets:
            a, b = part[m], ".".join(t.split(".")[:2])
            if a != b and a.split(".")[0] == b.split(".")[0]:
                uses[a].add(b)

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            for nxt in uses.get(stack.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    cycles = sorted(f"{a} <-> {b}" for a in uses for b in uses[a] if reaches(b, a))
    assert not cycles, cycles


def test_the_checkpoint_commands_run_without_torch() -> None:
    """`prime-node origin`, `relay` and `fetch-weights` move bytes: loading torch cost them 1.4 s at start-up, about
    300 MB each, and 0.1-0.2 s at exit, which a broadcast's last client waits for (benchmarks/shardcast.py)."""
    import subprocess
    import sys

    probe = (
        "import sys, node.cli.main, node.relay.client, node.relay.mirror, node.relay.origin, node.relay.trust\n"
        "loaded = sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
