"""Node.js programs that tests run as a second implementation of a standard we speak: js-libp2p dials our libp2p
host (tests/p2p/js), ethers.js checks our EIP-712 messages and signs requests to our servers
(tests/interop/ethers). Each folder pins its packages in package.json and package-lock.json, and `npm ci` installs
them there the first time a test needs them. Without Node.js a test skips, and fails instead under CI=true."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest

NPM_CI_TIMEOUT = 90  # seconds; `npm ci` of either folder takes 4 to 10 s here


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true requires Node.js programs: {reason}")
    pytest.skip(reason)


def node_script(folder: Path, script: str) -> list[str]:
    """The command that runs `folder/script` with node, after `npm ci` in `folder` if its node_modules is missing or
    older than its lock file."""
    fix = f"put Node.js 20 or later (node and npm) on PATH; the test runs `npm ci` in {folder} itself"
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unavailable(f"no node or npm on PATH: {fix}")
    installed = folder / "node_modules" / ".package-lock.json"  # npm writes it last
    if not installed.exists() or installed.stat().st_mtime < (folder / "package-lock.json").stat().st_mtime:
        command = [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"]
        try:
            result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=NPM_CI_TIMEOUT)
        except subprocess.TimeoutExpired:
            unavailable(f"`npm ci` in {folder} took over {NPM_CI_TIMEOUT} s (no registry?)")
        if result.returncode != 0:
            unavailable(f"`npm ci` in {folder} exited {result.returncode} (no registry?): {result.stderr[-500:]}")
    return [node, str(folder / script)]


async def node_json(command: list[str], stdin: bytes = b"", timeout: float = 60.0) -> Any:
    """Run a node script without blocking the event loop (the test's servers may be answering it) and return the
    JSON of its last output line; a non-zero exit fails the test with the script's stderr."""
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout)
    assert process.returncode == 0, f"{command[1:]} exited {process.returncode}:\n{err.decode()[-3000:]}"
    return json.loads(out.decode().strip().splitlines()[-1])
