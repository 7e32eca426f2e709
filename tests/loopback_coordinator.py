"""A real coordinator on loopback: `CoordinatorService` behind `CoordinatorApi` (aiohttp) on a free port, as the
tests and benchmarks that move files through one start it (tests/trainer/test_api.py,
tests/validator/test_large_honest_files.py, benchmarks/large_files.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount

from node.serving import serve
from node.signing import SigningDomain
from trainer.api import CoordinatorApi
from trainer.coordinator import CoordinatorService, PoolState
from trainer.inbox import RolloutInbox
from trainer.roles import StaticRoles
from trainer.verdicts import VerdictStore


def coordinator_service(
    root: Path,
    domain: SigningDomain,
    *,
    trainer: LocalAccount,
    worker: str,
    validator: str,
    pool_id: int = 0,
    verdicts: VerdictStore | None = None,
    **options: Any,
) -> CoordinatorService:
    """Pool `pool_id` at step 0, signed for by `trainer`, with one member (`worker`) and one validator; uploads go
    to `root/inbox`, verdicts to `verdicts` (in memory unless given). `options` are CoordinatorService's others
    (`config`, `task_spec_hash` ...)."""
    return CoordinatorService(
        domain=domain,
        state=PoolState(pool_id=pool_id, trainer=trainer.address),
        roles=StaticRoles(members=frozenset({worker}), validators=frozenset({validator})),
        inbox=RolloutInbox(root / "inbox"),
        verdicts=VerdictStore() if verdicts is None else verdicts,
        signer=trainer,
        **options,
    )


@asynccontextmanager
async def serving(service: CoordinatorService) -> AsyncIterator[tuple[CoordinatorApi, str]]:
    """The service's API listening on a free loopback port, and its base URL; stopped on leaving."""
    api = CoordinatorApi(service)
    served = await serve(api.app, "127.0.0.1", 0, service.config.connections, name="coordinator")
    try:
        yield api, f"http://127.0.0.1:{served.port}"
    finally:
        await served.stop()
