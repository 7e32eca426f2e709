"""Every doctor check in order, each turned into a `CheckResult` whatever it raises."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from core.errors import one_line
from node.doctor.checks import (
    CheckResult,
    DoctorConfig,
    Finding,
    check_chain,
    check_disk,
    check_docker,
    check_gpu,
    check_memory,
    check_model,
    check_ports,
    check_python,
    check_sources,
    check_torch,
    check_vllm,
    fail,
)
from node.doctor.selftest import check_self_test

log = logging.getLogger(__name__)

# --- running them ------------------------------------------------------------------------------------

CHECKS: tuple[tuple[str, Callable[[DoctorConfig], Finding]], ...] = (
    ("python", check_python),
    ("torch", check_torch),
    ("gpu", check_gpu),
    ("vllm", check_vllm),
    ("memory", check_memory),
    ("model", check_model),
    ("disk", check_disk),
    ("docker", check_docker),
    ("ports", check_ports),
    ("chain", check_chain),
    ("sources", check_sources),
    ("self-test", check_self_test),
)


def run_check(name: str, check: Callable[[DoctorConfig], Finding], config: DoctorConfig) -> CheckResult:
    started = time.perf_counter()
    try:
        found = check(config)
    except Exception as exc:  # a probe's own bug must not hide the other checks; it is reported, not swallowed
        log.debug("check %s raised", name, exc_info=True)
        found = fail(
            f"the check raised {type(exc).__name__}: {one_line(exc)}", "rerun with PRIME_DEBUG=1 and report it"
        )
    return CheckResult(name, found.status, found.detail, found.fix, time.perf_counter() - started)


def run_checks(config: DoctorConfig, on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Every check in order; `on_result` sees each result as soon as it is known (the self-test takes seconds)."""
    results = []
    for name, check in CHECKS:
        result = run_check(name, check, config)
        if on_result is not None:
            on_result(result)
        results.append(result)
    return results
