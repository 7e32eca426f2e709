"""Parsing uploads off the coordinator's event loop: in child processes with a memory limit and a timeout.

Decoding a rollout file is CPU-bound and its cost is set by a stranger. On the event loop, a 4 KB Parquet bomb held
every request for 6 s and took 1.3 GB; `read_rollouts` now bounds decoding (protocol/rollouts/bounds.py), and this
module keeps whatever risk is left out of the coordinator's process:

- each parse runs in one of `workers` long-lived child processes (`python -m trainer.parsing`), awaited through
  pipes, so the event loop keeps answering while files are parsed, and at most `workers` are parsed at once
  (the rest wait their turn asynchronously);
- a child's address space is capped at `memory_bytes` (RLIMIT_AS), so no file can exhaust the host;
- a parse that outlasts `timeout`, or whose child dies, kills that child; the next parse starts a fresh one.

The child runs `inspect_rollouts`: every check of `read_rollouts`, without building Python rows, and answers with
the file's metadata only. Every failure is an `UnparsedUpload` with a code the API answers with (one of
`protocol.coordinator.ErrorCode`'s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from core.exhaustion import Resource, exhausted
from protocol.rollouts.meta import RolloutMeta, encode_meta, parse_meta
from protocol.rollouts.reader import inspect_rollouts
from protocol.rollouts.schema import RolloutFormatError
from trainer.errors import TrainerError

_REQUEST = struct.Struct("<QQ")  # max_bytes, then the body's length; the body follows
_ANSWER = struct.Struct("<I")  # the answer's JSON length; the JSON follows
_READY = b"R"  # a child's first byte: imports done, memory capped
WORKER_COMMAND = (sys.executable, "-m", "trainer.parsing")


@dataclass(frozen=True)
class ParseConfig:
    """Limits of the processes that parse uploads."""

    workers: int = 2  # files parsed at once
    memory_bytes: int = 4 << 30  # address space of one parsing process: a file at the token cap peaks at 1.8 GiB
    timeout: float = 60.0  # seconds one parse may take
    start_timeout: float = 30.0  # seconds a new process may take to import pyarrow (about 0.5 s)

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= 64:
            raise ValueError(f"workers must be 1 to 64, got {self.workers}")
        if self.memory_bytes < 512 << 20:
            raise ValueError(
                f"memory_bytes must be at least 512 MiB (pyarrow alone maps 350 MiB), got {self.memory_bytes}"
            )
        if not (self.timeout > 0 and self.start_timeout > 0):
            raise ValueError(f"timeout and start_timeout must be positive, got {self.timeout}, {self.start_timeout}")


class UnparsedUpload(TrainerError):
    """An upload refused while parsing: `code` is `malformed_file`, `too_large`, `parse_timeout` or `parser_died`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class UploadParser:
    """Parses uploads in child processes; `parse` never blocks the event loop. `close` ends the children."""

    def __init__(self, config: ParseConfig | None = None, *, command: Sequence[str] = WORKER_COMMAND) -> None:
        self.config = config or ParseConfig()
        self._workers = [_Worker([*command, str(self.config.memory_bytes)]) for _ in range(self.config.workers)]
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        for worker in self._workers:
            self._idle.put_nowait(worker)

    async def parse(self, body: bytes, max_bytes: int) -> RolloutMeta:
        """The metadata of a file `read_rollouts(body, max_bytes=max_bytes)` accepts; raises UnparsedUpload."""
        worker = await self._idle.get()
        try:
            answer = await worker.ask(body, max_bytes, self.config)
        finally:
            self._idle.put_nowait(worker)
        if "error" in answer:
            raise UnparsedUpload(str(answer["error"]), str(answer.get("message", "")))
        return parse_meta(str(answer["meta"]).encode())

    async def close(self) -> None:
        for worker in self._workers:
            await worker.stop()


class _Worker:
    """One child process, started when first asked and again after it dies or is killed."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.process: asyncio.subprocess.Process | None = None

    async def ask(self, body: bytes, max_bytes: int, config: ParseConfig) -> dict[str, object]:
        try:
            process = await self._started(config.start_timeout)
            assert process.stdin is not None and process.stdout is not None
            async with asyncio.timeout(config.timeout):
                process.stdin.write(_REQUEST.pack(max_bytes, len(body)))
                process.stdin.write(body)
                await process.stdin.drain()
                (length,) = _ANSWER.unpack(await process.stdout.readexactly(_ANSWER.size))
                answer = json.loads(await process.stdout.readexactly(length))
        except TimeoutError:
            await self.stop()
            raise UnparsedUpload("parse_timeout", f"parsing the file took more than {config.timeout:g} s") from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:  # the child died: its memory limit, or a crash
            status = await self.stop()
            raise UnparsedUpload(
                "parser_died", f"the parsing process died on this file (exit status {status}): {type(exc).__name__}"
            ) from None
        except BaseException:  # cancelled between request and answer: the pipe is out of step, so the child goes
            self._kill()
            raise
        if not isinstance(answer, dict):
            await self.stop()
            raise UnparsedUpload("parser_died", "the parsing process answered garbage")
        if answer.get("error") == "too_large":  # after a failed allocation the child's state is unknown
            await self.stop()
        return answer

    async def _started(self, start_timeout: float) -> asyncio.subprocess.Process:
        """The running child; a new one has imported pyarrow and capped its memory once it sends its ready byte."""
        if self.process is not None and self.process.returncode is None:
            return self.process
        self.process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(start_timeout):
                ready = await self.process.stdout.readexactly(1)
        except TimeoutError:
            await self.stop()
            raise UnparsedUpload("parser_died", f"the parsing process did not start in {start_timeout:g} s") from None
        if ready != _READY:
            await self.stop()
            raise UnparsedUpload("parser_died", f"the parsing process started with {ready!r}, not {_READY!r}")
        return self.process

    def _kill(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()

    async def stop(self) -> int | None:
        """Kills the child, if any; returns its exit status."""
        process = self.process
        self._kill()
        return None if process is None else await process.wait()


def _serve(requests: BinaryIO, answers: BinaryIO, memory_bytes: int) -> None:
    """The child's loop: one answer per request until stdin closes (the parent kills it after a MemoryError)."""
    too_large = f"parsing the file needs more than the parser's {memory_bytes}-byte memory limit"
    while header := requests.read(_REQUEST.size):
        max_bytes, length = _REQUEST.unpack(header)
        body = requests.read(length)
        answer: dict[str, object]
        try:
            answer = {"meta": encode_meta(inspect_rollouts(body, max_bytes=max_bytes).meta).decode()}
        except RolloutFormatError as exc:
            answer = {"error": "malformed_file", "message": str(exc)}
            if exhausted(exc) == Resource.MEMORY:  # pyarrow's, which the reader calls undecodable data
                answer = {"error": "too_large", "message": f"{too_large}: {exc.__cause__}"}
        except MemoryError:
            answer = {"error": "too_large", "message": too_large}
        data = json.dumps(answer).encode()
        answers.write(_ANSWER.pack(len(data)) + data)
        answers.flush()


def main() -> None:
    """`python -m trainer.parsing MEMORY_BYTES`: caps its address space, then answers requests on stdin/stdout."""
    memory_bytes = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    answers.write(_READY)
    answers.flush()
    _serve(sys.stdin.buffer, answers, memory_bytes)


if __name__ == "__main__":
    main()
