"""The Docker sandbox: programs run and report; hostile ones are contained and leave no container behind.

Tests marked `docker` skip when no engine answers (run `scripts/ensure-docker.sh`), except under CI=true, where
they fail instead so that CI cannot pass without running them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from protocol.sandbox import (
    CONTAINER_LABEL,
    SandboxInputError,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    ensure_sandbox_image,
    run_code,
)
from protocol.sandbox.errors import FIX_LINE
from protocol.sandbox.runner import MAX_CODE_BYTES, MAX_STDIN_BYTES, _Capture
from tests.conftest import docker_or_skip

SCRIPT = Path(__file__).parents[3] / "scripts/ensure-docker.sh"
FAST = SandboxLimits(wall_time_s=2.0)  # hostile programs that run until killed cost this much each


@pytest.fixture(scope="module")
def docker_client() -> Any:
    client = docker_or_skip()
    ensure_sandbox_image(client)  # build once, outside any test's timing
    return client


@pytest.fixture
def sandbox(docker_client: Any) -> Iterator[Any]:
    """The client; after the test, no sandbox container may remain."""
    yield docker_client
    assert docker_client.containers.list(all=True, filters={"label": CONTAINER_LABEL}) == []


def run(client: Any, code: str, stdin: str = "", limits: SandboxLimits = FAST) -> SandboxResult:
    return run_code(code, stdin, limits=limits, client=client)


# --- without Docker -------------------------------------------------------------------------------------------


def test_dead_docker_host_raises_unavailable_with_fix_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/dead.sock")
    with pytest.raises(SandboxUnavailable) as info:
        run_code("print(1)")
    message = str(info.value)
    assert message.endswith(FIX_LINE)
    assert FIX_LINE == "start Docker: scripts/ensure-docker.sh"
    assert "\n" not in message


def test_capture_demultiplexes_frames_split_at_any_byte() -> None:
    frames = b"\x01\x00\x00\x00\x00\x00\x00\x03out" + b"\x02\x00\x00\x00\x00\x00\x00\x03err" + b"\x01" + bytes(6)
    frames += b"\x02ok"
    capture = _Capture(cap=1024)
    for i in range(len(frames)):
        capture.feed(frames[i : i + 1])
    assert (bytes(capture.stdout), bytes(capture.stderr), capture.truncated) == (b"outok", b"err", False)


def test_capture_keeps_at_most_the_cap_and_flags_truncation() -> None:
    capture = _Capture(cap=5)
    capture.feed(b"\x01\x00\x00\x00\x00\x00\x00\x04abcd" + b"\x02\x00\x00\x00\x00\x00\x00\x04efgh")
    assert (bytes(capture.stdout), bytes(capture.stderr), capture.truncated) == (b"abcd", b"e", True)


def test_exactly_cap_bytes_is_not_truncation() -> None:
    capture = _Capture(cap=4)
    capture.feed(b"\x01\x00\x00\x00\x00\x00\x00\x04abcd")
    assert not capture.truncated


def test_oversized_code_is_refused_before_any_container() -> None:
    with pytest.raises(SandboxInputError, match="code is"):
        run_code("#" * (MAX_CODE_BYTES + 1), client=object())  # type: ignore[arg-type]  # never used


def test_ensure_docker_script_rejects_unknown_arguments() -> None:
    done = subprocess.run([str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=10, check=False)
    assert done.returncode == 2
    assert "unknown argument" in done.stderr


@pytest.mark.parametrize("bad", [{"cpus": 0.0}, {"wall_time_s": 0.0}, {"pids": 1}, {"memory_bytes": 1 << 20}])
def test_limits_out_of_range_are_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="SandboxLimits"):
        SandboxLimits(**bad)  # type: ignore[arg-type]


# --- with Docker ----------------------------------------------------------------------------------------------


@pytest.mark.docker
def test_ensure_docker_script_is_a_quick_no_op_when_the_engine_runs(sandbox: Any) -> None:
    started = time.monotonic()
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert time.monotonic() - started < 30  # a hang guard: no install, no engine start


@pytest.mark.docker
def test_program_reads_stdin_every_usual_way(sandbox: Any) -> None:
    code = "import os, sys\na = os.read(0, 4)\nb = input()\nc = sys.stdin.read()\nprint(a, b, c.split())"
    result = run(sandbox, code, "one\ntwo\nthree four\n")
    assert result.ok, result.stderr
    assert result.stdout == "b'one\\n' two ['three', 'four']\n"  # fd 0 is a real file, then sys.stdin reads on


@pytest.mark.docker
def test_program_and_stdin_near_their_size_limits_arrive_intact(sandbox: Any) -> None:
    code = "import sys\ndata = sys.stdin.read()\nprint(len(data), data[-3:])\n" + "#" * (MAX_CODE_BYTES - 100)
    stdin = "x" * (MAX_STDIN_BYTES - 3) + "end"
    result = run(sandbox, code, stdin)
    assert result.ok, result.stderr
    assert result.stdout == f"{MAX_STDIN_BYTES} end\n"


@pytest.mark.docker
def test_exit_code_and_stderr_are_reported(sandbox: Any) -> None:
    result = run(sandbox, "import sys\nprint('out')\nprint('boom', file=sys.stderr)\nsys.exit(3)")
    assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "out\n", "boom\n", False)


@pytest.mark.docker
def test_runs_as_nobody_without_capabilities_or_environment(sandbox: Any) -> None:
    code = (
        "import os\n"
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
        "print(os.getuid(), os.getgid(), caps[0], sorted(os.environ))"
    )
    result = run(sandbox, code)
    assert result.ok, result.stderr
    assert result.stdout.split(" ", 3)[:3] == ["65534", "65534", "0000000000000000"]
    assert "DOCKER" not in result.stdout and "SECRET" not in result.stdout


@pytest.mark.docker
def test_endless_loop_times_out_and_is_killed(sandbox: Any) -> None:
    result = run(sandbox, "while True:\n    pass")
    assert result.timed_out and not result.ok
    assert FAST.wall_time_s <= result.duration_s < FAST.wall_time_s + 3


@pytest.mark.docker
def test_fork_bomb_hits_the_pids_limit_and_ends_with_the_time_limit(sandbox: Any) -> None:
    code = (
        "import os, sys\n"
        "refused = False\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        if not refused:\n"
        "            refused = True\n"
        "            sys.stderr.write('refused\\n')\n"
        "            sys.stderr.flush()\n"
    )
    started = time.monotonic()
    result = run(sandbox, code)
    assert "refused" in result.stderr  # fork failed: the pids limit, not the clock, stopped the growth
    assert result.timed_out and not result.ok
    assert time.monotonic() - started < FAST.wall_time_s + 5


@pytest.mark.docker
def test_network_is_unreachable_even_to_the_host(sandbox: Any) -> None:
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    gateway = _bridge_gateway(sandbox)
    code = (
        "import socket\n"
        f"for address in [('1.1.1.1', 53), ('127.0.0.1', {port}), ('{gateway}', {port})]:\n"
        "    s = socket.socket()\n"
        "    s.settimeout(1)\n"
        "    try:\n"
        "        s.connect(address)\n"
        "        print('connected', address)\n"
        "    except OSError:\n"
        "        print('blocked')\n"
    )
    try:
        result = run(sandbox, code)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever reached the host's listener
    finally:
        server.close()
    assert result.ok, result.stderr
    assert result.stdout.split() == ["blocked"] * 3


@pytest.mark.docker
def test_huge_output_is_truncated_at_the_cap_with_bounded_memory(sandbox: Any) -> None:
    limits = SandboxLimits(wall_time_s=5.0, output_bytes=64 * 1024)
    tracemalloc.start()
    try:
        result = run(sandbox, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", limits=limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.output_truncated and not result.ok and not result.timed_out
    assert len(result.stdout) + len(result.stderr) == limits.output_bytes
    assert peak < 2 * 1024 * 1024  # the program wrote gigabytes per second; we held a few chunks at most


@pytest.mark.docker
def test_huge_file_write_fails_when_tmpfs_is_full(sandbox: Any) -> None:
    code = (
        "import sys\n"
        "try:\n"
        "    with open('/tmp/big', 'wb') as f:\n"
        "        for _ in range(64):\n"
        "            f.write(b'x' * (1 << 20))\n"
        "except OSError as exc:\n"
        "    print(exc.errno)\n"
        "    sys.exit(1)\n"
    )
    result = run(sandbox, code)
    assert (result.exit_code, result.stdout) == (1, "28\n")  # ENOSPC at the 16 MiB tmpfs


@pytest.mark.docker
def test_memory_hog_is_oom_killed(sandbox: Any) -> None:
    result = run(sandbox, "s = 'x' * (1 << 30)\nprint(len(s))")
    assert result.oom_killed and not result.ok
    assert result.stdout == ""


@pytest.mark.docker
def test_root_filesystem_is_read_only_and_shm_absent(sandbox: Any) -> None:
    code = (
        "for path in ['/evil', '/usr/lib/evil', '/etc/evil', '/dev/shm/evil']:\n"
        "    try:\n"
        "        open(path, 'a').close()\n"
        "        print('wrote', path)\n"
        "    except OSError as exc:\n"
        "        print(exc.errno)\n"
    )
    result = run(sandbox, code)
    assert result.stdout.split() == ["30", "30", "30", "2"]  # EROFS three times, then ENOENT


@pytest.mark.docker
def test_interrupt_during_a_run_still_removes_the_container(sandbox: Any) -> None:
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run(sandbox, "while True:\n    pass", limits=SandboxLimits(wall_time_s=30))
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
    # the `sandbox` fixture asserts that no container is left


def _bridge_gateway(client: Any) -> str:
    """The host's address on Docker's default bridge: what a container with a network would reach it at."""
    try:
        return str(client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Gateway"])
    except (KeyError, IndexError, Exception):
        return "172.17.0.1"
