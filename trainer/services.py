"""What `prime-train run` serves while it trains: the coordinator API (its counters and published steps kept across
restarts), the SHARDCAST origin, gossip and /metrics.

`open_services` starts them around a run's step loop, with the loop's current policy published, and stops them
after it; `Services.publish` makes a newly trained policy current everywhere at once. The step loop itself is
`trainer.run`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from eth_account.signers.local import LocalAccount

from core import trace
from core.heap import heap_bytes
from protocol.coordinator.client import PublishedStep
from protocol.rollouts import RolloutFile
from protocol.rollouts.writer import publish_atomically
from protocol.signing import SigningDomain
from protocol.tasks.spec import spec_hash
from trainer.api import CoordinatorApi
from trainer.config import RunConfig
from trainer.coordinator import STEP_HISTORY, CoordinatorService, PoolState
from trainer.counters import CounterJournal
from trainer.inbox import RolloutInbox
from trainer.loop import TrainingLoop, assignment_of
from trainer.roles import Roles
from trainer.verdicts import VerdictStore

if TYPE_CHECKING:
    from protocol.terms import PoolTerms
    from shardcast.origin import Origin
    from trainer.gossip import TrainerGossip

log = logging.getLogger(__name__)

STEP_GAUGES = ("reward_mean", "pass_rate", "loss", "grad_norm", "clipped_fraction", "tokens_per_s")


class Uploads(Protocol):
    """The uploads the step loop may train on now, less those in `consumed` (trained on, or dropped as stale).

    The loop asks after every upload and attestation, and every 0.5 s while it waits, for the whole run: an
    answer costs what arrived since the last call plus the uploads still waiting, never all uploads of the run.
    A consumed upload is left out for good, so `consumed` must only grow.
    """

    def __call__(self, inbox: RolloutInbox, verdicts: VerdictStore, consumed: AbstractSet[bytes]) -> list[Path]: ...


@dataclass(frozen=True)
class Network:
    """Who the run trusts: its signing key and domain, who may upload, and which uploads count as accepted."""

    account: LocalAccount
    domain: SigningDomain
    pool_id: int
    roles: Roles
    accepted: Uploads  # which files of the inbox may be trained on
    terms: PoolTerms | None = None  # network mode: the pool's terms (protocol.terms), which the run's config must keep


@dataclass
class Services:
    """The running services of one run, and what the step loop asks of them."""

    network: Network
    loop: TrainingLoop
    state: PoolState  # the step the coordinator serves, and when each step became current
    service: CoordinatorService
    origin: Origin
    gossip: TrainerGossip | None
    api_url: str
    origin_url: str
    steps_file: Path  # steps.jsonl: when each step became current, across restarts
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # an upload or an attestation came in
    uploaded: dict[str, set[bytes]] = field(default_factory=dict)  # node -> its uploads no published step used
    last: dict[str, Any] = field(default_factory=dict)  # the last step's metrics record, for /metrics

    def accepted(self) -> list[Path]:
        """The files the loop may train on now (every upload in local mode, attested ones on the network)."""
        return self.network.accepted(self.service.inbox, self.service.verdicts, self.loop.counters.consumed)

    async def publish(self, step: int, trained: Sequence[RolloutFile] = ()) -> None:
        """Makes policy `step` current: its checkpoint on the origin, the coordinator's step, then gossip; the
        assignments of the files `trained` on it leave the count in flight."""
        self.service.in_flight.settle([assignment_of(f) for f in trained])
        with trace.span("publish", step=step):
            manifest = await self.origin.publish(self.loop.paths.checkpoint(step), step)
        publish_step(self.state, step, self.steps_file)
        _release(self.uploaded, self.loop.counters.consumed)  # before the requests woken by the publication run
        if self.gossip is not None:  # after the coordinator serves the step: a worker may act on it at once
            await self.gossip.announce(manifest)

    def note(self, record: dict[str, Any]) -> None:
        """The step's metrics record, which /metrics shows until the next."""
        self.last.clear()
        self.last.update(record)


@contextlib.asynccontextmanager
async def open_services(config: RunConfig, network: Network, loop: TrainingLoop) -> AsyncIterator[Services]:
    """The coordinator, the origin and gossip (`[p2p]`) serving `loop`'s run, its current policy published and
    endpoints.json written; all stopped on leaving."""
    from core.serving import serve
    from shardcast.origin import Origin
    from shardcast.server import ShardServer
    from shardcast.store import ShardStore

    journal = _counter_journal(config.run_dir, loop.assignment_counters)
    state = PoolState(network.pool_id, network.account.address, loop.learner.step, dict(loop.assignment_counters))
    steps_file = config.run_dir / "steps.jsonl"
    state.remember(load_published(steps_file))
    arrived = asyncio.Event()
    uploaded: dict[str, set[bytes]] = {}

    def persist_counter(node: str, counter: int) -> Awaitable[None]:
        loop.assignment_counters[node] = counter + 1
        return journal.record(node, counter + 1)  # durable before the assignment is answered, fsyncs batched

    async def on_upload(work_key: bytes, node: str) -> None:
        if config.api.pending_files_per_node:  # a rejected file is never consumed: keep none when nobody counts
            uploaded.setdefault(node, set()).add(work_key)
        arrived.set()

    service = CoordinatorService(
        domain=network.domain,
        state=state,
        roles=network.roles,
        inbox=RolloutInbox(config.run_dir / "inbox"),
        verdicts=VerdictStore(config.run_dir / "attestations.jsonl"),  # the validators' verdicts, kept across restarts
        config=config.api,
        on_upload=on_upload,
        on_assign=persist_counter,
        on_attest=lambda _: arrived.set(),  # network mode trains on attested files: look again at once
        pending=lambda node: len(uploaded.get(node, ())),
        signer=network.account,  # upload receipts (what a worker shows if the coordinator loses its file), assignments
        task_spec_hash=spec_hash(loop.spec),
    )
    api = CoordinatorApi(service)
    last: dict[str, Any] = {}
    _gauges(api, loop, last)
    served = await serve(api.app, config.host, config.api_port, api.config.connections, name="coordinator")
    api_url = f"http://{config.host}:{served.port}"
    server = ShardServer(ShardStore(config.run_dir / "origin"), role="origin")
    origin_url = f"http://{config.host}:{await server.start(config.host, config.shardcast_port)}"
    origin = Origin(
        server, account=network.account, domain=network.domain, pool_id=network.pool_id, keep=config.keep_versions,
        manifest_format=config.manifest_format, delta=config.delta,
    )  # fmt: skip
    gossip: TrainerGossip | None = None
    try:
        if config.p2p is not None:
            from trainer.gossip import TrainerGossip  # libp2p takes a second or two to import

            gossip = TrainerGossip(
                network.account, network.domain, network.pool_id, host=config.p2p.host, port=config.p2p.port,
                registry=api.metrics,
            )  # fmt: skip
            await gossip.start()
        services = Services(
            network, loop, state, service, origin, gossip, api_url, origin_url, steps_file, arrived, uploaded, last
        )
        await services.publish(loop.learner.step)
        log.info("coordinator on %s, origin on %s, policy step %d", api_url, origin_url, loop.learner.step)
        endpoints = {"coordinator": api_url, "origin": origin_url, "trainer": network.account.address}
        if gossip is not None:
            endpoints["p2p"] = gossip.listen_addr
        # whole or not at all: a devnet or a benchmark polls for this file and parses it as soon as it exists
        publish_atomically(config.run_dir / "endpoints.json", (json.dumps(endpoints, indent=2) + "\n").encode())
        yield services
    finally:
        if gossip is not None:
            await gossip.stop()
        await served.runner.cleanup()
        await server.stop()
        await journal.close()


def _counter_journal(run_dir: Path, counters: dict[str, int]) -> CounterJournal:
    """The journal of the next assignment counter of every node, `counters` (the saved state's) brought up to it."""
    legacy = run_dir / "counters.json"  # before trainer/counters.py: read once, then superseded
    if legacy.exists():  # handed out after the last saved state: never hand them out again
        for node, counter in json.loads(legacy.read_text()).items():
            counters[node] = max(counters.get(node, 0), int(counter))
    journal = CounterJournal.open(run_dir / "counters.journal", counters)
    counters.update(journal.counters)
    return journal


def _gauges(api: CoordinatorApi, loop: TrainingLoop, last: dict[str, Any]) -> None:
    """The trainer's gauges on the coordinator's /metrics: time waiting for data, the C heap, the last step's."""
    api.metrics.gauge(
        "trainer_idle_seconds_total", "Seconds spent waiting for data.", lambda: loop.counters.idle_seconds
    )
    for name, index, what in (("in_use", 0, "in use"), ("free", 1, "free and kept in its arenas")):
        api.metrics.gauge(
            f"trainer_heap_{name}_bytes", f"malloc's bytes {what} (glibc; 0 elsewhere).", _heap_gauge(index)
        )

    def last_value(name: str) -> Callable[[], float]:
        return lambda: float(last.get(name) or 0.0)

    for name in STEP_GAUGES:
        api.metrics.gauge(f"trainer_{name}", f"{name} of the last step.", last_value(name))


def load_published(path: Path) -> list[PublishedStep]:
    """The last STEP_HISTORY lines of `steps.jsonl`: when each step became current, across restarts."""
    entries: list[PublishedStep] = []
    with contextlib.suppress(FileNotFoundError), path.open(encoding="utf-8") as lines:
        for line in lines:
            try:
                record = json.loads(line)
                entries.append(PublishedStep(int(record["step"]), float(record["at"])))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a crash
    return entries[-STEP_HISTORY:]


def publish_step(state: PoolState, step: int, path: Path) -> None:
    """Makes `step` current now, recording when in `path` (validators judge a file's staleness by this time)."""
    entry = state.publish(step, time.time())
    if entry is not None:
        with path.open("a", encoding="utf-8") as log_file:
            log_file.write(json.dumps({"step": entry.step, "at": entry.at}) + "\n")
            log_file.flush()
            os.fsync(log_file.fileno())


def _heap_gauge(index: int) -> Callable[[], float]:
    """A gauge of `core.heap.heap_bytes()[index]`: what a step leaves in malloc shows on /metrics."""
    return lambda: float((heap_bytes() or (0, 0))[index])


def _release(uploaded: dict[str, set[bytes]], consumed: AbstractSet[bytes]) -> None:
    """Forget the uploads a step trained on or dropped as stale. Called as a step is published, not as it is
    trained: a worker whose files were just trained on then gets the new step's assignments, not the old step's."""
    for node, keys in uploaded.items():
        uploaded[node] = {k for k in keys if k not in consumed}
