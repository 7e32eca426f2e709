"""Errors of the sandbox package. Engine problems and refused inputs are errors; a program that misbehaves is not
(its timeout, OOM kill or crash is reported in `SandboxResult`)."""

from __future__ import annotations

from core.errors import NodeError

FIX_LINE = "start Docker: scripts/ensure-docker.sh"


class SandboxError(NodeError):
    """Base of every error raised by `protocol.sandbox`: the engine failed in a way that says nothing about the code."""


class SandboxUnavailable(SandboxError):
    """No Docker engine answers; the message ends with the one line that fixes it."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"Docker engine not reachable at {where} ({reason}); {FIX_LINE}")


class SandboxImageError(SandboxError):
    """The sandbox image could not be assembled or imported; `step` names the stage that failed."""

    def __init__(self, step: str, problem: str) -> None:
        self.step = step
        self.problem = problem
        super().__init__(f"building the sandbox image failed at {step}: {problem}")


class SandboxInputError(SandboxError):
    """Code or stdin the sandbox refuses before starting a container (too large to pass in)."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(f"{what} is {size} bytes; the sandbox accepts at most {limit}")
