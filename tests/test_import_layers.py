"""The import tower (docs/architecture.md): core <- ledger <- protocol <- engine, shardcast, p2p <- node <- validator,
trainer <- devnet. No package imports one above it or beside it; no service module imports a CLI module; no two parts
of one package import each other, and no modules at all import each other in a circle. Read from the source with
`ast`, inline imports and TYPE_CHECKING ones included: an import that runs back up a layer is a defect even where it
happens to work."""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

from core.logs import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
LAYER = {
    "core": 0,  # utilities: errors, parsing, logs, serving, metrics, the heap, SQLite
    "ledger": 1,  # the chain: contracts' client, events, transactions, the CLI kit
    "protocol": 2,  # what every role agrees on: terms, pool spec, signing, coordinator messages, rollouts, tasks
    "engine": 3,  # the model, inference, generation, proofs
    "shardcast": 3,  # checkpoints through relays
    "p2p": 3,  # libp2p gossip
    "node": 4,  # the worker daemon and prime-node
    "validator": 5,
    "trainer": 5,
    "devnet": 6,  # starts every role
}


def test_the_layers_rank_every_package_of_the_project() -> None:
    assert tuple(LAYER) == PACKAGES  # core.logs' list, which pyproject.toml's and the worker image's follow


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def graph() -> dict[str, set[tuple[str, int]]]:
    """module -> the project modules it imports, with the line."""
    return imports({module_name(p): p.read_text() for pkg in LAYER for p in (ROOT / pkg).rglob("*.py")})


def imports(sources: dict[str, str]) -> dict[str, set[tuple[str, int]]]:
    """module -> the modules of `sources` (name -> text) it imports, with the line. `from a import b` where a.b is
    a module is an import of a.b (a's `__init__` runs first, but a package's parts may import their siblings so)."""
    modules = set(sources)
    edges: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [n for n in names if n in modules] or [node.module]
            for target in targets:
                while target and target not in modules:  # `from a.b import name`: the module a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add((target, node.lineno))
    return edges


def is_cli(module: str) -> bool:
    return "cli" in module.split(".")


def upward_imports(edges: dict[str, set[tuple[str, int]]]) -> list[str]:
    return [
        f"{m} -> {t} (line {line})"
        for m, targets in edges.items()
        for t, line in targets
        if m.split(".")[0] != t.split(".")[0] and LAYER[t.split(".")[0]] >= LAYER[m.split(".")[0]]
    ]


def module_cycles(edges: dict[str, set[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(t for t, _ in edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, nexts = work[-1]
            for nxt in nexts:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(t for t, _ in edges.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[module] = min(low[module], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    part = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        part.append(top)
                        if top == module:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
    return found


def test_imports_point_down_the_layers() -> None:
    assert not upward_imports(graph()), upward_imports(graph())


def test_no_modules_import_each_other_in_a_circle() -> None:
    """Inside one package too: protocol.tasks' sources and its spec did, and the inference backends and the sampler."""
    assert not module_cycles(graph()), module_cycles(graph())


def test_the_checks_see_an_upward_import_and_a_cycle() -> None:
    """The two checks above on the real tree with one import injected: each must fail."""
    sources = {module_name(p): p.read_text() for pkg in LAYER for p in (ROOT / pkg).rglob("*.py")}
    upward = dict(sources, **{"protocol.terms": sources["protocol.terms"] + "\nfrom node.daemon.worker import X\n"})
    line = upward["protocol.terms"].count("\n")
    assert upward_imports(imports(upward)) == [f"protocol.terms -> node.daemon.worker (line {line})"]
    sideways = dict(sources, **{"engine.proofs": sources["engine.proofs"] + "\nimport shardcast.manifest\n"})
    assert [line.split(" (")[0] for line in upward_imports(imports(sideways))] == [
        "engine.proofs -> shardcast.manifest"
    ]
    circle = dict(
        sources, **{"protocol.tasks.errors": sources["protocol.tasks.errors"] + "\nimport protocol.tasks.spec\n"}
    )
    assert ["protocol.tasks.errors", "protocol.tasks.spec"] in [
        [m for m in part if m in ("protocol.tasks.errors", "protocol.tasks.spec")]
        for part in module_cycles(imports(circle))
    ]


def test_no_service_module_imports_a_cli_module() -> None:
    found = [f"{m} -> {t} (line {line})" for m, ts in graph().items() if not is_cli(m) for t, line in ts if is_cli(t)]
    assert not found, found


def test_no_two_parts_of_a_package_import_each_other() -> None:
    """node.daemon may import protocol.rollouts, or the other way, never both (parts: the second level of a name)."""
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
        "import sys, node.cli.main, shardcast.client, shardcast.mirror, shardcast.origin, shardcast.trust\n"
        "loaded = sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
