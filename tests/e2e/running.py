"""Daemons as separate processes for the end-to-end tests: each started through its CLI, its output kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


class Processes:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *command: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", *command],
            cwd=self.root,
            stdout=(self.root / f"{name}.out").open("w"),
            stderr=(self.root / f"{name}.log").open("w"),
            start_new_session=True,
        )
        self.running[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-2500:]}" for n in self.running)

    def stop_all(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def wait_for(condition: Callable[[], bool], what: str, processes: Processes, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{processes.logs()}")
        time.sleep(0.25)
