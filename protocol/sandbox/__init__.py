"""Docker sandbox for untrusted code: `run_code(code, stdin, limits=...)` runs one Python program in a throw-away
container without network and under hard limits, and reports what it did (see runner.py and docs/sandbox.md).

    from protocol.sandbox import SandboxLimits, run_code
    result = run_code("print(int(input()) * 2)", "21\\n", limits=SandboxLimits(wall_time_s=5))
    assert result.ok and result.stdout == "42\\n"

Docker is imported lazily: importing this package costs nothing until a program runs.
"""

from protocol.sandbox.errors import SandboxError, SandboxImageError, SandboxInputError, SandboxUnavailable
from protocol.sandbox.image import ensure_sandbox_image
from protocol.sandbox.runner import CONTAINER_LABEL, SandboxLimits, SandboxResult, connect, run_code

__all__ = [
    "CONTAINER_LABEL",
    "SandboxError",
    "SandboxImageError",
    "SandboxInputError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "connect",
    "ensure_sandbox_image",
    "run_code",
]
