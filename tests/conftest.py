"""Shared fixtures: one real anvil per test session, reverted to a snapshot after every test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ledger.accounts import dev_account
from ledger.chain import LocalChain
from ledger.client import Ledger
from ledger.deployment import Deployment

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of `make test`'s pytest-xdist workers (Makefile: TEST_WORKERS)
    # xdist's workers run with COLUMNS=80 and LINES=24 in their environment, which rich (every command's console)
    # and the processes the tests start take as the terminal's size: tables cut short under -n, whole without it.
    # The tests see what a pipe sees, with or without workers.
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)
    # Several workers on few cores: torch's OpenMP threads spin while they wait for a core, and two of them in each
    # of three workers made a 34 s SFT fixture take over 300 s. One thread each, in the worker and what it starts
    # (a test that wants more asks for it: torch.set_num_threads, or a role's threads setting).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Loaded only once a vLLM engine is built (`vllm.LLM`); importing vLLM's classes leaves them out.
VLLM_ENGINE_MODULES = ("vllm.entrypoints.llm", "vllm.v1.engine.llm_engine")
TOKEN = 10**18  # one whole StakeToken in base units
UNBONDING_PERIOD = 2 * 24 * 3600


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread for the test, for bit-exact comparisons. With two, how the CPU kernels split a product
    between threads varies now and then (copies at other addresses, another process running OpenMP work), and the
    results differ in their last bits: about 5e-7 in every weight after a learner step; log-probs that changed a
    regenerated rollout file's work key in 1 run in 5 beside a competing torch process."""
    import torch  # here, so that tests without torch collect without it

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def session_chain() -> Iterator[tuple[LocalChain, Deployment]]:
    chain = LocalChain().start()
    try:
        yield chain, chain.deploy(unbonding_period=UNBONDING_PERIOD)
    finally:
        chain.stop()


@pytest.fixture
def chain(session_chain: tuple[LocalChain, Deployment]) -> Iterator[LocalChain]:
    """The session's chain; every change a test makes (blocks, time, state) is undone afterwards."""
    local, _ = session_chain
    snapshot = local.snapshot()
    yield local
    local.revert(snapshot)


@pytest.fixture
def deployment(session_chain: tuple[LocalChain, Deployment]) -> Deployment:
    return session_chain[1]


@pytest.fixture
def ledger_for(chain: LocalChain, deployment: Deployment) -> Callable[[int], Ledger]:
    """`ledger_for(i)` sends as anvil development account i (0 deployed the contracts and mints tokens).

    Clients are made per test: each keeps a local nonce, which a snapshot revert would leave stale.
    """

    def make(index: int) -> Ledger:
        return Ledger(chain.w3, deployment, dev_account(index))

    return make


def docker_or_skip() -> Any:
    """A Docker client. Without an engine the test skips, except under CI=true, where the engine must exist."""
    from protocol.sandbox import SandboxUnavailable, connect

    try:
        return connect()
    except SandboxUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true requires a Docker engine: {exc}")
        pytest.skip(f"no Docker engine: {exc}")


@pytest.fixture(autouse=True)
def no_vllm_engine_in_the_test_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """A vLLM engine built in the pytest process binds its threads and memory for every later test (one made the
    learner's determinism tests fail far from it): build one in a subprocess, as a worker does. Only a `gpu` test,
    which needs one engine on CUDA, may build it here."""
    import sys

    before = any(name in sys.modules for name in VLLM_ENGINE_MODULES)
    yield
    if not before and request.node.get_closest_marker("gpu") is None:
        built = [name for name in VLLM_ENGINE_MODULES if name in sys.modules]
        assert not built, f"{request.node.nodeid} built a vLLM engine in the pytest process ({built[0]} loaded)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The worker image's tests first (a build of minutes when the sources changed: it then overlaps the rest of the
    run instead of ending it alone, as it did), then those marked slow, then the rest, each in collected order."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("docker") and item.get_closest_marker("slow"):
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)  # stable: the same order on every worker, as xdist requires
