"""Run one untrusted Python program in a throw-away Docker container and report what it did.

The container has no network, a read-only root, a small noexec tmpfs at /tmp, no /dev/shm, no capabilities,
no privilege escalation, an unprivileged user, and limits on memory (no swap), CPU, processes and open files.
Everything else is enforced from outside: the wall clock (we kill the container), the output (we read the attach
stream and stop at the cap; the engine keeps no log, so a chatty program cannot fill the disk) and cleanup (the
container is removed in a `finally`, by a name chosen before it exists, so even an interrupt during `create`
leaves nothing behind).

The program and its stdin travel as base64 command-line arguments of a small boot script, which writes stdin to a
file in /tmp, makes it file descriptor 0 and executes the program as `__main__`: no shared volume, no attach
stdin to half-close, and `input()`, `sys.stdin` and `open(0)` all behave as with a pipe.
"""

from __future__ import annotations

import binascii
import contextlib
import logging
import select
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocol.sandbox.errors import SandboxError, SandboxInputError, SandboxUnavailable
from protocol.sandbox.image import ensure_sandbox_image

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

logger = logging.getLogger(__name__)

KiB, MiB = 1 << 10, 1 << 20
CONTAINER_LABEL = "prime-sandbox"
MAX_CODE_BYTES = 256 * KiB
MAX_STDIN_BYTES = 512 * KiB
_ARG_CHUNK = 96 * KiB  # Linux refuses any single argument over 128 KiB (MAX_ARG_STRLEN)
_READ_CHUNK = 64 * KiB
_HEADER = 8  # attach stream frame: [stream, 0, 0, 0, size (4 bytes, big-endian)]
_ENGINE_TIMEOUT_S = 30  # for every engine call but the program's own run
_BOOT = """\
import binascii, os, sys
n = int(sys.argv[1])
src = binascii.a2b_base64(''.join(sys.argv[2:2 + n]))
data = binascii.a2b_base64(''.join(sys.argv[2 + n:]))
with open('/tmp/.stdin', 'wb') as f:
    f.write(data)
fd = os.open('/tmp/.stdin', os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
os.unlink('/tmp/.stdin')
del binascii, os, f, fd, data, n
sys.argv[:] = ['main.py']
exec(compile(src, 'main.py', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__})
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Resources of one run. The defaults fit the tiny programs of RL code tasks with a wide margin."""

    memory_bytes: int = 256 * MiB  # RAM, with swap equal to it (none)
    cpus: float = 0.5  # CPU cores (CFS quota)
    pids: int = 64  # processes and threads, the program included
    wall_time_s: float = 10.0  # from start to kill
    output_bytes: int = 64 * KiB  # stdout + stderr kept; more is truncation and ends the run
    tmpfs_bytes: int = 16 * MiB  # /tmp (stdin is stored there too)

    def __post_init__(self) -> None:
        for name, low in (("memory_bytes", 8 * MiB), ("pids", 2), ("output_bytes", 1), ("tmpfs_bytes", 2 * MiB)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"SandboxLimits.{name} must be an integer >= {low}, got {value!r}")
        if not 0.01 <= self.cpus <= 64:
            raise ValueError(f"SandboxLimits.cpus must lie in [0.01, 64], got {self.cpus}")
        if not 0.1 <= self.wall_time_s <= 3600:
            raise ValueError(f"SandboxLimits.wall_time_s must lie in [0.1, 3600], got {self.wall_time_s}")


@dataclass(frozen=True)
class SandboxResult:
    """What a program did. `exit_code` is the container's (137 after a kill, by us or by the OOM killer)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    oom_killed: bool
    output_truncated: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        """Exited 0 on its own, within every limit."""
        return self.exit_code == 0 and not (self.timed_out or self.oom_killed or self.output_truncated)


@dataclass
class _Capture:
    """Demultiplexes the attach stream incrementally, keeping at most `cap` payload bytes in all."""

    cap: int
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    _header: bytearray = field(default_factory=bytearray)
    _stream: int = 0
    _left: int = 0  # payload bytes of the current frame not yet seen

    def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view and not self.truncated:
            if self._left == 0:
                take = min(_HEADER - len(self._header), len(view))
                self._header += view[:take]
                view = view[take:]
                if len(self._header) == _HEADER:
                    self._stream, self._left = self._header[0], int.from_bytes(self._header[4:8], "big")
                    self._header.clear()
                continue
            payload, view = view[: self._left], view[self._left :]
            self._left -= len(payload)
            room = self.cap - len(self.stdout) - len(self.stderr)
            (self.stderr if self._stream == 2 else self.stdout).extend(payload[:room])
            self.truncated = len(payload) > room


def connect(base_url: str | None = None) -> docker.DockerClient:
    """A client for the engine at `base_url` (default: Docker's own environment, DOCKER_HOST or the local socket).

    Raises `SandboxUnavailable` with the fix when no engine answers.
    """
    import docker
    import requests

    settings = {"base_url": base_url} if base_url else docker.utils.kwargs_from_env()  # as `docker.from_env()`
    where = settings.get("base_url") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(**settings, timeout=_ENGINE_TIMEOUT_S)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxUnavailable(where, _first_line(exc)) from None
    return client


def run_code(
    code: str,
    stdin: str = "",
    *,
    limits: SandboxLimits = SandboxLimits(),
    client: docker.DockerClient | None = None,
    image: str | None = None,
) -> SandboxResult:
    """Run `code` with `stdin` in a fresh container under `limits`; the container is gone when this returns.

    Misbehaviour of the program (timeout, OOM, crash, too much output) is reported in the result, never raised.
    Raises `SandboxUnavailable` when no engine answers, `SandboxInputError` for code or stdin too large to pass in,
    and `SandboxError` for any other engine failure.
    """
    import docker.errors
    import requests

    command = _command(code, stdin)
    client = client or connect()
    name = f"{CONTAINER_LABEL}-{uuid.uuid4().hex[:20]}"
    failed = True
    try:
        image = image or ensure_sandbox_image(client)
        container = client.containers.create(image, command, name=name, **_container_options(limits))
        result = _run(client, container, limits)
        failed = False
        return result
    except requests.exceptions.ConnectionError as exc:
        raise SandboxUnavailable(str(client.api.base_url), _first_line(exc)) from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxError(f"sandbox run {name} failed: {_first_line(exc)}") from None
    finally:
        _remove(client, name, quiet=failed)  # quiet: never hide the exception in flight (or an interrupt)


def _command(code: str, stdin: str) -> list[str]:
    """`python3 -I -c BOOT n code-chunks... stdin-chunks...`, each chunk under the kernel's argument limit."""
    source = code.encode("utf-8", "surrogatepass")  # a lone surrogate is the program's problem: a SyntaxError
    data = stdin.encode("utf-8")
    if len(source) > MAX_CODE_BYTES:
        raise SandboxInputError("code", len(source), MAX_CODE_BYTES)
    if len(data) > MAX_STDIN_BYTES:
        raise SandboxInputError("stdin", len(data), MAX_STDIN_BYTES)
    code_chunks, stdin_chunks = _b64_chunks(source), _b64_chunks(data)
    return ["python3", "-I", "-c", _BOOT, str(len(code_chunks)), *code_chunks, *stdin_chunks]


def _b64_chunks(data: bytes) -> list[str]:
    text = binascii.b2a_base64(data, newline=False).decode("ascii")
    return [text[i : i + _ARG_CHUNK] for i in range(0, len(text), _ARG_CHUNK)] or [""]


def _container_options(limits: SandboxLimits) -> dict[str, Any]:
    from docker.types import LogConfig, Ulimit

    return {
        "labels": {CONTAINER_LABEL: "1"},
        "user": "65534:65534",
        "working_dir": "/tmp",
        "hostname": "sandbox",
        "network_mode": "none",
        "ipc_mode": "none",  # no /dev/shm: the only writable place is the size-limited /tmp
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,noexec,nosuid,nodev,size={limits.tmpfs_bytes},mode=1777"},
        "mem_limit": limits.memory_bytes,
        "memswap_limit": limits.memory_bytes,
        "nano_cpus": round(limits.cpus * 1e9),
        "pids_limit": limits.pids,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "ulimits": [Ulimit(name="core", soft=0, hard=0), Ulimit(name="nofile", soft=256, hard=256)],
        "oom_score_adj": 1000,  # if the host itself runs out of memory, the sandbox dies first
        "log_config": LogConfig(type="none"),
    }


def _run(client: docker.DockerClient, container: Container, limits: SandboxLimits) -> SandboxResult:
    capture = _Capture(cap=limits.output_bytes)
    sock = client.api.attach_socket(container.id, params={"stdout": 1, "stderr": 1, "stream": 1, "logs": 0})
    try:
        container.start()
        started = time.monotonic()
        deadline = started + limits.wall_time_s
        timed_out = _read_until_eof(sock, capture, deadline)
    finally:
        # Before any kill: the engine blocks on output nobody reads and would never let the container stop.
        _close(sock)
    status = None if timed_out or capture.truncated else _wait(container, deadline - time.monotonic())
    if status is None:  # past the deadline (a program may close stdout and stderr, then keep running)
        timed_out = not capture.truncated
        _kill(container)
        status = container.wait(timeout=_ENGINE_TIMEOUT_S)
    duration = time.monotonic() - started
    container.reload()
    return SandboxResult(
        exit_code=int(status.get("StatusCode", -1)),
        stdout=capture.stdout.decode("utf-8", "replace"),
        stderr=capture.stderr.decode("utf-8", "replace"),
        timed_out=timed_out,
        oom_killed=bool(container.attrs["State"].get("OOMKilled", False)),
        output_truncated=capture.truncated,
        duration_s=duration,
    )


def _read_until_eof(sock: Any, capture: _Capture, deadline: float) -> bool:
    """Feed the attach stream to `capture` until EOF, the cap, or the deadline; True if the deadline came first."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
    while not capture.truncated:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(remaining * 1000):
            return True
        chunk = sock.recv(_READ_CHUNK) if hasattr(sock, "recv") else sock.read(_READ_CHUNK)
        if not chunk:
            return False
        capture.feed(chunk)
    return False


def _close(sock: Any) -> None:
    """Close the attach connection for real: docker-py hands out a SocketIO whose close() may leave it open."""
    raw = getattr(sock, "_sock", sock)
    with contextlib.suppress(OSError):  # already closed by the engine
        raw.shutdown(socket.SHUT_RDWR)
    sock.close()
    raw.close()


def _wait(container: Container, timeout_s: float) -> dict[str, Any] | None:
    """The exit status once the container stops, or None if it still runs after `timeout_s`."""
    import requests

    try:
        status: dict[str, Any] = container.wait(timeout=max(timeout_s, 0.05))
    except requests.exceptions.ConnectionError as exc:  # docker-py reports a read timeout on its socket like this
        if "timed out" not in str(exc).lower():
            raise
        return None
    except requests.exceptions.Timeout:
        return None
    return status


def _kill(container: Container) -> None:
    """SIGKILL the container's init; the kernel then kills every process in its PID namespace."""
    import docker.errors

    try:
        container.kill()
    except docker.errors.APIError as exc:
        if exc.status_code not in (404, 409):  # already gone or already stopped: nothing left to kill
            raise


def _remove(client: docker.DockerClient, name: str, *, quiet: bool) -> None:
    """Force-remove the container by name; a failure is logged when `quiet`, else raised."""
    import docker.errors
    import requests

    try:
        client.api.remove_container(name, force=True, v=True)
    except docker.errors.NotFound:
        pass  # never created (the failure came first) or already removed
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        if not quiet:
            raise SandboxError(f"could not remove sandbox container {name}: {_first_line(exc)}") from None
        logger.error("could not remove sandbox container %s: %s", name, _first_line(exc))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
