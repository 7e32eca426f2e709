"""Verifying a file with the address space capped just above what the validator holds once its model is loaded:
issue 32's attack 1, run in a child process by tests/validator/test_could_not_judge.py (a cap binds a whole
process, and the test process must keep its memory).

    python -m tests.validator.capped_verify scan FILE MODEL TASK
        loads the model, then for each headroom of HEADROOMS caps the address space at what is mapped plus that
        much, calls `verify_file`, and lifts the cap; prints one JSON line, the outcome of each
    python -m tests.validator.capped_verify cli FILE MODEL TASK
        runs `prime-validate file FILE --checkpoint MODEL --task TASK`, capped at what is mapped the moment its
        model is loaded (no headroom: the next mapping of fresh memory fails)

Where an allocation fails under a cap depends on the allocators' state, so `scan` steps the headroom from nothing to
plenty: small ones fail inside pyarrow's decoding (before issue 32 a reason-2 `corrupt` verdict), in lazy imports,
in the tokenizer's thread pool; large ones verify. The cap is set from outside the code it limits: before
`verify_file`, and for the command by wrapping the loader it calls, so nothing in the validator knows of it.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

KIB, MIB = 1 << 10, 1 << 20
HEADROOMS = (*range(0, 2 * MIB, 64 * KIB), 4 * MIB, 16 * MIB, 64 * MIB)


def mapped_bytes() -> int:
    """The process's address space now (VmSize), which RLIMIT_AS bounds."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * KIB
    raise RuntimeError("no VmSize in /proc/self/status")


def cap_address_space(headroom: int) -> None:
    """The soft RLIMIT_AS at what is mapped now plus `headroom` bytes (the hard limit stays, so it can be lifted)."""
    resource.setrlimit(resource.RLIMIT_AS, (mapped_bytes() + headroom, resource.getrlimit(resource.RLIMIT_AS)[1]))


def lift_cap() -> None:
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def scan(file: Path, model: Path, task: Path) -> list[dict[str, Any]]:
    from engine.model.loading import load_model
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from validator.verify import verify_file

    spec = load_task_spec(task)
    source = open_source(spec)
    loaded = load_model(model)
    data = file.read_bytes()
    outcomes: list[dict[str, Any]] = []
    for headroom in HEADROOMS:
        cap_address_space(headroom)
        try:
            verdict = verify_file(data, spec=spec, checkpoint=loaded, source=source)
        except Exception as exc:  # whatever the validator raised instead of a verdict
            outcome = {"raised": type(exc).__name__, "check": getattr(exc, "check", None), "message": str(exc)}
            outcome["cause"] = str(getattr(exc, "cause", None))
        else:
            outcome = {"accepted": verdict.accepted, "reason": verdict.reason, "detail": verdict.detail}
        finally:
            lift_cap()
        outcomes.append({"headroom": headroom, **outcome})
    return outcomes


def run_cli(file: Path, model: Path, task: Path) -> None:
    import engine.model.loading
    from validator.cli import app

    load_model = engine.model.loading.load_model

    def load_then_cap(*args: Any, **kwargs: Any) -> Any:
        loaded = load_model(*args, **kwargs)
        cap_address_space(0)
        return loaded

    engine.model.loading.load_model = load_then_cap  # the command imports it from the module when it runs
    app(["file", str(file), "--checkpoint", str(model), "--task", str(task)], prog_name="prime-validate")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    mode, file, model, task = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    if mode == "scan":
        print(json.dumps(scan(file, model, task)), flush=True)
    elif mode == "cli":
        run_cli(file, model, task)
    else:
        raise SystemExit(f"unknown mode {mode!r}: scan or cli")


if __name__ == "__main__":
    main()
