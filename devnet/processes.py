"""The devnet's child processes: each role started through its CLI, its output in one log file per process.

Every child runs `python -m <module> ...` with this interpreter, in its own session (process group), so that a
stop reaches the processes it starts too. Stopping is SIGTERM first (the daemons finish the file in hand and
exit cleanly), then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Supervisor:
    def __init__(self, cwd: Path, logs: Path) -> None:
        self.cwd, self.logs = cwd, logs
        self.children: dict[str, Child] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, module: str, *args: str) -> Child:
        """Starts `python -m module args` in the run folder; stdout and stderr go to `logs/<name>.log`."""
        if name in self.children and self.children[name].running:
            raise RuntimeError(f"{name} is already running")
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        child = self.children[name] = Child(name, process, log)
        return child

    def stop(self, *names: str, grace: float = 20.0) -> None:
        """SIGTERM to each named child's process group, then SIGKILL to those still running after `grace`."""
        children = [self.children[n] for n in names if n in self.children]
        for child in children:
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child, signal.SIGKILL)
                child.process.wait()

    def stop_all(self, grace: float = 10.0) -> None:
        # workers first (they finish their file and submit it), then the servers they talk to
        order = sorted(self.children, key=lambda n: (not n.startswith("worker"), n != "validator", n))
        self.stop(*order, grace=grace)


def _signal_group(child: Child, sig: signal.Signals) -> None:
    if child.process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):  # it exited between the poll and the signal
        os.killpg(child.process.pid, sig)
