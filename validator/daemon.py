"""The validator daemon (`prime-validate run`): every submission of its pool verified, attested, and acted on.

One loop, one submission at a time (DESIGN section 1, step 5):
1. follow `BatchSubmitted` of the pool from the stored cursor (the deployment block at first), recording each
   batch and the new cursor in one transaction (`validator.store`), then fetch each batch's leaf list from the
   coordinator and check it (`validator.batches`): a sound list becomes one row per file, a faulty one condemns the
   batch (invalidated with the proof of the faulty leaf, or without one when no list was ever made available);
2. download the file from the coordinator; a file the coordinator still does not have `grace_seconds` after
   the submission was first seen gets the verdict "file unavailable" (reason 8). An unreachable coordinator
   is never held against the worker: the file is tried again later; nor is a file the coordinator stored,
   acknowledged with a receipt and then lost (410 `lost`): it is unverifiable, never slashed;
3. verify it (`validator.verify.verify_file`) with the checkpoint of the step its rows claim, fetched through
   SHARDCAST on demand (`validator.checkpoints`). Staleness is judged twice. On signed facts: the file's assignment,
   signed by the trainer with its step and issue time, against the submission's block timestamp and the pool's
   assignment lifetime (`protocol.terms.AssignmentTiming`); past that deadline the file is stale and slashed. On the
   coordinator's word: the pool's step at the time of the submission (the newest step of the coordinator's
   unsigned `GET /v1/steps` published by the submission's block timestamp), so that a validator catching up on a
   backlog judges each file by the window its worker had; outside that window a file is refused (borderline),
   never slashed. A step whose checkpoint no source offers any more makes the file `unverifiable`: logged, never
   slashed;
4. post a signed attestation to the coordinator, and (with a p2p port) publish it on the pool's attestations
   topic (`validator.gossip`; best effort, never fatal);
5. on a rejection, keep the evidence first (`validator.evidence`: the file, the verdict with its per-chunk
   statistics, the checkpoint, the leaf's Merkle proof; until the challenge window closes), then re-read the batch
   on chain and, unless it is already invalidated or its window has closed, call `invalidateBatch` with the reason
   and the file's proof (the whole batch void, the provider slashed, the node ejected). A borderline rejection (not
   clear on the second route of `validator.recompute`) is attested, so nobody trains on it, and its leaf refused on
   chain (`refuseLeaf`): never paid, never slashed, the node not ejected. A refused leaf may still be shown by an
   invalidation inside its window by a validator that finds it clearly bad.

Validators that share a pool (validator.sharing) each follow every submission and check their share of the keys:
their heartbeats and attestations travel on gossip, the chain's `ValidatorSet` says who they are, and a validator
silent for `takeover_seconds` has its share taken over. Before a taken-over key is verified, the coordinator is
asked whether enough validators judged it already.

Every transition is committed before the next side effect, so a restart resumes where the last run stopped. SIGTERM
or SIGINT drops a verification in progress (its row stays `seen`) and lets a chain call in flight finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from core import trace
from core.exhaustion import exhausted
from core.metrics import Registry, serve_metrics
from engine.memory import MemoryShortfall
from engine.model.loading import LoadedModel
from ledger.client import Ledger
from ledger.errors import ContractRevert, LedgerError
from ledger.events import (
    BatchInvalidated,
    BatchSubmitted,
    EventFollower,
    default_confirmations,
)
from ledger.merkle import BatchTree, LeafProof
from ledger.tx import with_retries
from ledger.types import BatchRecord, BatchStatus, Reason
from ledger.validators import ValidatorSet
from protocol.batches import decode_leaves, encode_leaves
from protocol.coordinator.client import CoordinatorClient, CoordinatorError, CoordinatorLostFile, CoordinatorRefused
from protocol.coordinator.pool import PublishedStep
from protocol.rollouts import read_rollouts
from protocol.rollouts.schema import RolloutFormatError
from protocol.rollouts.writer import publish_atomically
from protocol.signing import Attestation, SigningDomain
from protocol.tasks.sources import open_source
from protocol.tasks.spec import TaskSpec, spec_hash
from protocol.terms import (
    DEFAULT_TIMING,
    AssignmentTiming,
    challenge_closes_at,
)
from shardcast.trust import TrustPolicy
from validator.batches import check_leaves
from validator.checkpoints import Checkpoints, memory_gate
from validator.checks import ASSIGNMENT, names_another_node
from validator.config import ValidatorConfig
from validator.errors import CheckpointGone, CouldNotJudge, NotAValidator, ValidatorError
from validator.evidence import Evidence
from validator.sharing import Peers
from validator.slots import Presence, SlotBatch, held_in, presence
from validator.store import (
    ATTESTED,
    COVERED,
    GONE,
    INVALIDATED,
    REFUSED,
    REJECTED,
    SEEN,
    UNAVAILABLE,
    UNVERIFIABLE,
    VERIFIED,
    BatchRow,
    BatchSubmission,
    Submission,
    ValidatorStore,
    WorkRow,
)
from validator.timing import Stopped, interruptible, retry_delay, steps_around
from validator.verdict import Outcome, Sanction, Verdict, reject, sanction
from validator.verify import Expected, verify_file

if TYPE_CHECKING:
    from p2p import ValidatorHeartbeat
    from protocol.signing import Attestation as SignedAttestation
    from validator.gossip import ValidatorGossip

log = logging.getLogger("validator.daemon")

DOWNLOAD = "download"  # `Verdict.check` of a file that could not be downloaded
EVIDENCE_SLACK_SECONDS = 24 * 3600  # evidence outlives its window by this much: block times and clocks drift
VALIDATOR_SET_SECONDS = 10.0  # between reads of the chain's validator set


@dataclass(frozen=True)
class PoolSetup:
    """What the daemon needs to know about its pool besides the chain: where files, checkpoints and the task are."""

    pool_id: int
    trainer: str  # signs the checkpoints (from the pool's config on chain)
    coordinator: str
    checkpoints: tuple[str, ...]  # SHARDCAST sources: the origin and relays
    task: TaskSpec
    replication: int = 1  # validators that check each key (the pool's term, protocol.terms.PoolTerms.replication)
    # the assignments' lifetime and clock slack (the pool's terms, protocol.terms.PoolTerms.timing): what makes a
    # file stale
    timing: AssignmentTiming = DEFAULT_TIMING


class ValidatorDaemon:
    def __init__(
        self,
        ledger: Ledger,
        setup: PoolSetup,
        config: ValidatorConfig,
        state_dir: Path,
        *,
        metrics_host: str = "127.0.0.1",
        metrics_port: int | None = None,
        p2p_port: int | None = None,
        bootstrap: tuple[str, ...] = (),
        dashboard_host: str = "127.0.0.1",
        dashboard_port: int | None = None,
        memory_budget: int | None = None,
    ) -> None:
        if ledger.account is None:
            raise ValidatorError("the validator daemon signs attestations and transactions: give it a key")
        if config.dtype != setup.task.sampling.dtype:  # every tolerance would be the wrong one, and honest files fail
            raise ValidatorError(
                f"the pool's task generates in {setup.task.sampling.dtype} (sampling.dtype) and this validator would "
                f"recompute in {config.dtype}: pass --dtype {setup.task.sampling.dtype}, or leave --dtype out"
            )
        if config.heartbeat_seconds > config.takeover_seconds / 2:  # one lost heartbeat would look like a stop
            raise ValidatorError(
                f"a heartbeat every {config.heartbeat_seconds:g} s is too rare for a takeover after "
                f"{config.takeover_seconds:g} s of silence: give --heartbeat at most half of --takeover"
            )
        self.ledger, self.setup, self.config, self.state_dir = ledger, setup, config, state_dir
        self.account = ledger.account
        if not ledger.is_validator(setup.pool_id, self.account.address):  # before the state folder is bound to it
            raise NotAValidator(self.account.address, setup.pool_id)
        self.metrics_host, self.metrics_port = metrics_host, metrics_port
        self.dashboard_host, self.dashboard_port = dashboard_host, dashboard_port  # None: no dashboard; 0: any port
        self.p2p_port, self.bootstrap = p2p_port, bootstrap  # None: no gossip; 0: any free port
        self.gossip: ValidatorGossip | None = None
        deployment = ledger.deployment
        self.domain = SigningDomain(deployment.chain_id, deployment.address("ComputePool"))
        self.store = ValidatorStore.open(
            state_dir,
            chain_id=deployment.chain_id,
            work_ledger=deployment.address("WorkLedger"),
            pool_id=setup.pool_id,
            validator=self.account.address,
        )
        self.confirmations = (
            default_confirmations(deployment.chain_id) if config.confirmations is None else config.confirmations
        )
        self.follower = self._follower()
        policy = TrustPolicy(self.domain, setup.trainer, setup.pool_id)
        self.source = open_source(setup.task)
        self.checkpoints = Checkpoints(
            state_dir / "checkpoints",
            setup.checkpoints,
            policy,
            keep=config.checkpoints_kept,
            device=config.device,
            dtype=config.dtype,
            # a checkpoint this machine cannot hold stops the daemon before it loads (MemoryShortfall, below)
            before_load=memory_gate(setup.task, self.source, config, budget=memory_budget).check,
        )
        self.evidence = Evidence(state_dir)
        self.validator_set = ValidatorSet(ledger, setup.pool_id)
        self.peers = Peers(self.account.address, config.takeover_seconds, started=time.time())
        self._live = self.peers.live(time.time())
        self._set_read_at = -VALIDATOR_SET_SECONDS
        self._chain_lag: float | None = None  # wall clock less chain time, read with the validator set
        self._window: int | None = None  # the pool's challenge window (seconds), read from the chain at start
        self._max_units: int | None = None  # the pool's cap on a file's units, read with it
        self.stopping = asyncio.Event()
        self.metrics_url: str | None = None
        self.dashboard_url: str | None = None
        self._last_poll = 0.0
        self._setup_metrics()

    def _follower(self) -> EventFollower:
        """Follows the pool's batches and their invalidations from the stored cursor and block hashes."""
        return EventFollower(
            self.ledger,
            pool_id=self.setup.pool_id,
            start_block=self.store.cursor(self.ledger.deployment.block),
            hashes=self.store.block_hashes(),
            # another validator's invalidation covers every file of a batch
            events=("BatchSubmitted", "BatchInvalidated"),
            confirmations=self.confirmations,
        )

    def _setup_metrics(self) -> None:
        m = self.metrics = Registry()
        self._seen = m.counter("validator_files_seen_total", "Files read from the chain: the leaves of listed batches.")
        self._accepted = m.counter("validator_files_accepted_total", "Files accepted.")
        self._rejected = m.counter("validator_files_rejected_total", "Files rejected, by reason.")
        self._unavailable = m.counter(
            "validator_files_unavailable_total", "Files the coordinator did not have within the grace period."
        )
        self._unverifiable = m.counter(
            "validator_files_unverifiable_total",
            "Files never judged, never slashed: their step's checkpoint is gone, the coordinator lost them, or this "
            "validator could not judge them in judge_attempts tries.",
        )
        self._not_judged = m.counter(
            "validator_could_not_judge_total",
            "Verifications that failed on this validator's side, by cause (memory, disk, descriptors, checkpoint, "
            "internal): tried again, never a verdict.",
        )
        self._invalidations = m.counter(
            "validator_invalidations_sent_total",
            "Invalidations of a file sent (invalidateBatch with the file's proof).",
        )
        self._batch_invalidations = m.counter(
            "validator_batch_invalidations_sent_total",
            "Invalidations of a batch for its leaf list sent (invalidateBatch, invalidateUnavailableBatch).",
        )
        self._batches_seen = m.counter("validator_batches_seen_total", "Batch submissions read from the chain.")
        self._batches_rejected = m.counter(
            "validator_batches_rejected_total",
            "Batches whose leaf list itself condemned them (never made available, or not what the chain records), "
            "by reason.",
        )
        self._refusals = m.counter("validator_refusals_sent_total", "refuseLeaf transactions sent (borderline).")
        self._borderline = m.counter(
            "validator_files_borderline_total", "Rejections not clear enough to slash: attested, refused, not slashed."
        )
        self._verify_seconds = m.counter("validator_verification_seconds_total", "Seconds spent verifying files.")
        self._last_verify = m.gauge("validator_last_verification_seconds", "Seconds the last verification took.")
        m.gauge("validator_cursor_block", "The next block to read events from.", lambda: self.follower.next_block)
        self._reorgs = m.counter(
            "validator_chain_reorganisations_total",
            "Reorganisations of the chain found under the event cursor (each read again from the fork).",
        )
        self._gone = m.counter(
            "validator_files_gone_total", "Submissions a reorganisation removed from the chain before they were judged."
        )
        m.gauge("validator_open_files", "Submissions not finished yet.", lambda: self.store.open_count())
        m.gauge(
            "validator_share_waiting_files",
            "Submissions of other validators' shares whose verdicts have not been heard yet.",
            lambda: self.store.theirs_count(),
        )
        m.gauge("validator_live_validators", "Validators of the pool taken for alive, this one included.",
                lambda: len(self.peers.live(time.time())))  # fmt: skip
        m.gauge("validator_peers_heard", "Other validators of the pool whose heartbeat arrived recently.",
                lambda: len(self.peers.heard_recently(time.time())))  # fmt: skip
        self._covered = m.counter(
            "validator_files_covered_total", "Submissions another validator judged or invalidated: not verified here."
        )
        self._taken_over = m.counter(
            "validator_files_taken_over_total", "Submissions of a silent validator's share this one took over."
        )
        self._expired = m.counter(
            "validator_files_expired_total", "Submissions of other validators' shares whose window closed unheard."
        )

    # --- the loop -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Works until `stopping` is set."""
        pool_id, address = self.setup.pool_id, self.account.address
        runner = dashboard = None
        if self.metrics_port is not None:
            runner, self.metrics_url = await serve_metrics(self.metrics, self.metrics_host, self.metrics_port)
        if self.dashboard_port is not None:
            dashboard, self.dashboard_url = await self._serve_dashboard(self.dashboard_port)
            log.info("dashboard on %s", self.dashboard_url)
        endpoints = {"metrics": self.metrics_url, "dashboard": self.dashboard_url}
        if any(endpoints.values()):
            publish_atomically(
                self.state_dir / "endpoints.json",
                json.dumps({k: v for k, v in endpoints.items() if v}, indent=2).encode(),
            )
        log.info(
            "validator %s of pool %d: coordinator %s, checkpoints %s, reading the chain from block %d%s",
            address, pool_id, self.setup.coordinator, ", ".join(self.setup.checkpoints), self.follower.next_block,
            f", metrics at {self.metrics_url}" if self.metrics_url else "",
        )  # fmt: skip
        try:
            self._window = await asyncio.to_thread(self.ledger.challenge_window, pool_id)
            self._max_units = (await asyncio.to_thread(self.ledger.pool, pool_id)).config.max_units_per_key
            pruned = await asyncio.to_thread(self.evidence.prune, time.time())
            if pruned:
                log.info("pruned the evidence of %d rejections whose challenge windows closed", len(pruned))
            await self._read_validator_set()
            if self.p2p_port is not None:
                from validator.gossip import ValidatorGossip, heartbeat_now  # libp2p takes a second or two to import

                gossip = ValidatorGossip(
                    self.account, self.domain, pool_id, port=self.p2p_port, bootstrap=self.bootstrap,
                    registry=self.metrics, heartbeat_seconds=self.config.heartbeat_seconds,
                    heartbeat=lambda: heartbeat_now(pool_id, self.follower.next_block, self.store.open_count()),
                    on_heartbeat=self._heard_heartbeat, on_attestation=self._heard_attestation,
                )  # fmt: skip
                await gossip.start()
                self.gossip = gossip
            elif len(self.peers.validators) > 1:
                log.warning(
                    "%d validators share pool %d, but this one has no --p2p-port: it cannot hear them, and checks "
                    "every file once %g s have passed without a heartbeat", len(self.peers.validators), pool_id,
                    self.config.takeover_seconds,
                )  # fmt: skip
            async with CoordinatorClient.connect(  # a session of its own: every call timed and bounded
                self.setup.coordinator, self.account, self.domain, pool_id=self.setup.pool_id
            ) as client:
                self.client = client
                while not self.stopping.is_set():
                    if time.monotonic() - self._last_poll >= self.config.poll_seconds:
                        await self._follow()
                    batch = self.store.due_batch(time.time())  # a batch's list first: its files wait on it
                    if batch is not None:
                        await self._advance_batch(batch)
                        continue
                    row = self.store.due(time.time())
                    if row is None:
                        await self._pause(self._idle_seconds())
                        continue
                    with contextlib.suppress(Stopped):
                        await self._advance(row)
        finally:
            if self.gossip is not None:
                await self.gossip.stop()
            if dashboard is not None:
                await dashboard.cleanup()
            if runner is not None:
                await runner.cleanup()
            log.info("stopped; files by stage: %s", self.store.counts())
            self.store.close()

    async def _serve_dashboard(self, port: int) -> tuple[web.AppRunner, str]:
        """The operator's page (node/dashboard, validator view): verdicts, rejections, invalidations, backlog."""
        from node.dashboard import serve_dashboard
        from validator.dashboard import ValidatorDashboard

        w3 = self.ledger.w3
        source = ValidatorDashboard(
            self.store,
            validator=self.account.address,
            cursor=lambda: self.follower.next_block,
            head=lambda: int(w3.eth.block_number),
            stopping=self.stopping.is_set,
        )
        return await serve_dashboard(source, self.dashboard_host, port)

    def _idle_seconds(self) -> float:
        wait = self.config.poll_seconds - (time.monotonic() - self._last_poll)
        next_due = self.store.next_due_at()
        if next_due is not None:
            wait = min(wait, next_due - time.time())
        return max(0.05, wait)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _follow(self) -> None:
        """Records new batches with the cursor past them; a chain that fails is read again next time."""
        self._last_poll = time.monotonic()
        follower, store = self.follower, self.store
        w3, url = self.ledger.w3, self.ledger.deployment.rpc_url

        def block_timestamp(block: int) -> int:
            return int(with_retries(lambda: w3.eth.get_block(block)["timestamp"], what="read a block", url=url))

        invalidations: list[BatchInvalidated] = []

        def read() -> list[BatchSubmission]:
            stamps: dict[int, int] = {}
            batches = []
            for event in follower.poll():
                if event.pool_id != self.setup.pool_id:
                    continue
                if isinstance(event, BatchInvalidated):
                    invalidations.append(event)
                if not isinstance(event, BatchSubmitted):
                    continue
                block = event.at.block_number
                if block not in stamps:
                    stamps[block] = block_timestamp(block)
                batches.append(
                    BatchSubmission(
                        event.pool_id, event.root, event.node, event.count, event.total_units, block,
                        event.at.log_index, stamps[block], slot=event.slot,
                    )
                )  # fmt: skip
            return batches

        try:
            window = await self._challenge_window()
            batches = await asyncio.to_thread(read)
        except (LedgerError, OSError, ValueError) as exc:
            self.follower = self._follower()  # nothing recorded: read the same blocks again
            log.warning("reading the chain failed, trying again: %s", exc)
            return
        if follower.rewound_to is not None:
            self._reorgs.inc()
        # a root submitted again into its slot once its batch was settled is a new batch (validator.slots)
        added = store.record([], follower.next_block, follower.hashes, batches=batches, window=window)
        if added:  # their files are counted as seen when their lists are read (`_list`)
            self._batches_seen.inc(len(batches))
            log.info("%d new batches (cursor at block %d)", added, follower.next_block)
        for event in invalidations:
            if event.validator == self.account.address:
                continue
            moved = store.batch_invalidated_elsewhere(event.root, event.node, event.validator)
            if moved:
                self._covered.inc(moved)
                log.info("batch %s from %s: invalidated by validator %s; not judging its files here",
                         _short(event.root), event.node, event.validator)  # fmt: skip
        await self._share()

    # --- sharing the pool (validator.sharing) -------------------------------------------------------

    async def _read_validator_set(self) -> None:
        """The chain's validator set, read every VALIDATOR_SET_SECONDS; a failed read keeps the last one."""
        if time.monotonic() - self._set_read_at < VALIDATOR_SET_SECONDS:
            return
        self._set_read_at = time.monotonic()
        try:
            validators = await asyncio.to_thread(self.validator_set.read)
            self._chain_lag = time.time() - await asyncio.to_thread(self.ledger.timestamp)
        except LedgerError as exc:
            log.warning("reading the pool's validator set failed, keeping the last one: %s", exc)
            return
        if validators | {self.account.address} != self.peers.validators:
            self.peers.set_validators(validators)
            self._live = self.peers.live(time.time())  # one appointed now is presumed alive, not "heard again"
            log.info("the pool's validators: %s", ", ".join(sorted(self.peers.validators)))

    async def _share(self) -> None:
        """Takes over the share of validators gone silent, and retires other shares' rows whose window closed."""
        await self._read_validator_set()
        now, replication = time.time(), self.setup.replication
        live = self.peers.live(now)
        if live != self._live:
            gone, back = sorted(self._live - live), sorted(live - self._live)
            self._live = live
            taken = self.store.reassign(lambda key: self.peers.mine(key, replication, now)) if gone else 0
            self._taken_over.inc(taken)
            for validator in gone:
                log.warning("validator %s silent for %g s: taking over its share (%d files)", validator,
                            self.config.takeover_seconds, taken)  # fmt: skip
            for validator in back:
                log.info("validator %s is heard again: new files of its share are its own", validator)
        if self._window is not None and self._chain_lag is not None:
            chain_now = now - self._chain_lag  # submissions are stamped with block times, which may not be the wall's
            closed_before = int(chain_now - self._window - self.config.clock_slack)
            self._expired.inc(self.store.expire_theirs(closed_before))
            self.store.forget_heard(closed_before)
            # the safety net: a key of another's share unjudged half-way through its window is checked here too
            unheard = self.store.take_unheard(int(chain_now - self._window / 2))
            if unheard:
                self._taken_over.inc(unheard)
                log.warning("%d files of other validators' shares still unjudged half-way through their window: "
                            "checking them here", unheard)  # fmt: skip

    def _heard_heartbeat(self, signer: str, heartbeat: ValidatorHeartbeat) -> None:
        # the signed time counts, never the arrival: a heartbeat replayed later keeps no stopped validator alive
        if not self.peers.hear(signer, min(float(heartbeat.timestamp), time.time())):
            log.debug("a heartbeat from %s, who is not a validator of pool %d: ignored", signer, self.setup.pool_id)

    def _heard_attestation(self, signer: str, attestation: SignedAttestation) -> None:
        if signer == self.account.address or signer not in self.peers.validators:
            return
        covered = self.store.hear(attestation.work_key, signer, attestation.accepted, self.setup.replication)
        self._covered.inc(covered)

    async def _judged_elsewhere(self, row: WorkRow) -> bool:
        """Whether `replication` other validators of the pool accepted `row`'s file at the coordinator already (a
        taken-over key its validator judged before it stopped, or a gossip message this one missed); such a row
        becomes `covered`. A rejection by another is no reason to skip: slashing takes this validator's own
        evidence."""
        try:
            verdicts = await self.client.attestations(row.work_key, self.setup.pool_id)
        except CoordinatorError:
            return False  # the download that follows fails too, and is retried
        others = {v.validator for v in verdicts if v.validator in self.peers.validators}
        others.discard(self.account.address)
        accepted = {v.validator for v in verdicts if v.accepted and v.validator in others}
        if len(accepted) < self.setup.replication or any(not v.accepted for v in verdicts if v.validator in others):
            return False
        self.store.move(row, COVERED, note="accepted by " + ", ".join(sorted(accepted)))
        self._covered.inc()
        log.info("%s from %s: already accepted by %s; not verifying it again", _short(row.work_key), row.node,
                 ", ".join(sorted(accepted)))  # fmt: skip
        return True

    async def _advance(self, row: WorkRow) -> None:
        """Moves one submission one stage on (or schedules a retry)."""
        if row.stage == SEEN:
            await self._verify(row)
        elif row.stage in (VERIFIED, UNAVAILABLE):
            await self._attest(row)
        elif row.stage == ATTESTED:
            await self._invalidate(row)

    # --- batches: their leaf lists ------------------------------------------------------------------------

    async def _advance_batch(self, batch: BatchRow) -> None:
        """Fetches and checks a batch's leaf list (its leaves then wait as files), or sends the invalidation a
        faulty list calls for."""
        if batch.stage == SEEN:
            await self._list(batch)
        elif batch.stage == REJECTED:
            await self._invalidate_batch(batch)

    async def _list(self, batch: BatchRow) -> None:
        """The batch still on chain and pending, its leaf list from the coordinator, checked against the record
        (`validator.batches`). The coordinator failing, or serving a list that is not the root's, is retried; a list
        it receipted and then lost makes the batch unverifiable; one it never had after `grace_seconds` is the
        node's fault (reason 8), as for a file."""
        short = _short(batch.root)
        try:
            found, record = await self._read_slot(batch.node, batch.in_slot)
        except LedgerError as exc:
            self._retry_batch(batch, f"reading the batch on chain: {exc}")
            return
        if found is Presence.GONE:  # read from a block a reorganisation replaced
            self.store.move_batch(batch, UNVERIFIABLE, note=GONE)
            self._gone.inc()
            log.warning("batch %s from %s: %s; listed if it is submitted again", short, batch.node, GONE)
            return
        if found is Presence.OVERWRITTEN or record.status != BatchStatus.PENDING:
            note = f"the batch is {_settled(found, record)} on chain before its leaves were fetched"
            self.store.move_batch(batch, COVERED, note=note)
            log.info("batch %s from %s: %s; not judging its files", short, batch.node, note)
            return
        try:
            with trace.span("download_batch", root=batch.root.hex()):
                leaves = await self.client.download_batch(batch.root)
        except CoordinatorLostFile as exc:  # stored and receipted, then lost there: never the worker's fault
            self.store.move_batch(batch, UNVERIFIABLE, note=str(exc))
            self._unverifiable.inc(batch.count)
            log.warning("batch %s from %s: unverifiable, never invalidated: %s", short, batch.node, exc)
            return
        except CoordinatorError as exc:  # unreachable, or serving a list that is not the root's: not the worker's
            log.warning("batch %s: the coordinator failed, trying again: %s", short, exc)
            self._retry_batch(batch, str(exc))
            return
        if leaves is None:
            deadline = batch.first_seen + self.config.grace_seconds
            if time.time() < deadline:
                self._retry_batch(batch, "the coordinator does not have the leaf list yet", before=deadline)
                return
            detail = (
                f"the coordinator did not have the batch's leaf list {self.config.grace_seconds:g} s after the "
                "submission was seen"
            )
            self._reject_batch(batch, Reason.FILE_UNAVAILABLE, detail, leaf_index=None, leaves=None)
            return
        earlier = self.store.recorded_keys(batch.node, [leaf.work_key for leaf in leaves])
        earlier = {key: other for key, other in earlier.items() if other != batch.in_slot}  # its own rows, read again
        try:  # a batch a reorganisation took out is no earlier submission: its files may come back in another
            earlier = await self._still_on_chain(batch.node, earlier)
        except LedgerError as exc:
            self._retry_batch(batch, f"reading earlier batches on chain: {exc}")
            return
        max_units = self._max_units if self._max_units is not None else max(leaf.units for leaf in leaves)
        fault = check_leaves(
            leaves, count=batch.count, total_units=batch.total_units, max_units=max_units, earlier=earlier
        )
        encoded = encode_leaves(leaves)
        if fault is not None:
            self._reject_batch(batch, fault.reason, fault.detail, leaf_index=fault.leaf_index, leaves=encoded)
            return
        files = [
            Submission(
                batch.pool_id, leaf.work_key, batch.node, leaf.units, batch.block, batch.log_index, batch.submitted_at,
                root=batch.root, leaf_index=index,
            )
            for index, leaf in enumerate(leaves)
        ]  # fmt: skip
        now, replication = time.time(), self.setup.replication
        added = self.store.list_batch(batch, encoded, files, mine=lambda key: self.peers.mine(key, replication, now))
        self._seen.inc(added)
        log.info("batch %s from %s: %d files worth %d units listed", short, batch.node, len(leaves), batch.total_units)
        self._covered.inc(self.store.cover([leaf.work_key for leaf in leaves], replication))

    async def _still_on_chain(self, node: str, earlier: dict[bytes, SlotBatch]) -> dict[bytes, SlotBatch]:
        """`earlier` (work key -> the batch it was a leaf of) without the keys whose batch a reorganisation took out
        (`validator.slots`). A batch settled and written over since stays: its files were submitted, and maybe paid."""
        gone: set[SlotBatch] = set()
        for other in set(earlier.values()):
            found, _ = await self._read_slot(node, other)
            if found is Presence.GONE:
                gone.add(other)
        return {key: other for key, other in earlier.items() if other not in gone}

    async def _read_slot(self, node: str, batch: SlotBatch) -> tuple[Presence, BatchRecord]:
        """Whether `node`'s slot on chain still holds `batch` (`validator.slots.presence`), and the slot's record:
        the batch's own only when HELD."""
        record = await asyncio.to_thread(self.ledger.get_slot, self.setup.pool_id, node, batch.slot)
        return presence(batch, held_in(record), await self._challenge_window()), record

    async def _challenge_window(self) -> int:
        """The pool's challenge window (seconds), fixed when the pool was made: read from the chain once."""
        if self._window is None:
            self._window = await asyncio.to_thread(self.ledger.challenge_window, self.setup.pool_id)
        return self._window

    def _reject_batch(
        self, batch: BatchRow, reason: Reason, detail: str, *, leaf_index: int | None, leaves: bytes | None
    ) -> None:
        self.store.reject_batch(batch, int(reason), detail, leaf_index=leaf_index, leaves=leaves)
        self._batches_rejected.inc(reason=reason.name.lower())
        log.info("batch %s from %s: rejected, %s (reason %d): %s", _short(batch.root), batch.node,
                 reason.name.lower(), reason, detail)  # fmt: skip

    async def _invalidate_batch(self, batch: BatchRow) -> None:
        """Invalidates a batch its leaf list condemned: with the proof of the faulty leaf, or, when no list of the
        recorded count was made available, without one (reason 8); unless the chain says it is done or too late.
        The evidence (the list and the verdict) is kept first."""
        assert batch.reason is not None  # a rejected batch always carries its reason
        short, reason = _short(batch.root), Reason(batch.reason)
        if batch.attempts == 0 and len(self.peers.validators) > 1:  # the root's primary validator sends it first
            delay = self.peers.slash_delay(batch.root, self.setup.replication, time.time())
            if delay is None:
                delay = self.setup.replication * self.config.takeover_seconds
            if delay > 0:
                self.store.retry_batch_later(batch, delay, "waiting for the batch's primary validator")
                return
        try:
            await asyncio.to_thread(self._keep_batch_evidence, batch)
        except Exception as exc:  # this validator's failure: retried, never a reason to skip the evidence
            self._retry_batch(batch, f"keeping evidence: {exc}")
            return
        try:
            if await self._batch_settled(batch):
                return
            if batch.leaf_index is None:
                receipt = await asyncio.to_thread(
                    partial(self.ledger.invalidate_unavailable_batch, slot=batch.slot),
                    self.setup.pool_id, batch.node, batch.root,
                )  # fmt: skip
            else:
                proof = self._proof(batch.leaves, batch.leaf_index)
                receipt = await asyncio.to_thread(
                    partial(self.ledger.invalidate_batch, slot=batch.slot),
                    self.setup.pool_id, batch.node, batch.root, proof, reason,
                )  # fmt: skip
        except ContractRevert as exc:  # invalidated by another validator meanwhile, or its window closed
            log.warning("batch %s: the invalidation reverted: %s", short, exc)
            with contextlib.suppress(LedgerError):
                if await self._batch_settled(batch):
                    return
            self._retry_batch(batch, str(exc))
            return
        except LedgerError as exc:
            log.warning("batch %s: the invalidation failed, trying again: %s", short, exc)
            self._retry_batch(batch, str(exc))
            return
        tx = "0x" + bytes(receipt["transactionHash"]).hex()
        self.store.move_batch(batch, INVALIDATED, tx_hash=tx)
        self._batch_invalidations.inc()
        log.info("batch %s: invalidated (%s, reason %d) in %s; node %s slashed and ejected", short,
                 reason.name.lower(), reason, tx, batch.node)  # fmt: skip

    async def _batch_settled(self, batch: BatchRow) -> bool:
        """Records and returns True when nothing is left to send for a rejected batch: already invalidated, no
        longer pending (settled, perhaps its slot written over since), gone, or its window closed."""
        found, record = await self._read_slot(batch.node, batch.in_slot)
        if found is Presence.GONE:  # listed again if a reorganisation brings it back
            self.store.move_batch(batch, UNVERIFIABLE, note=GONE)
            log.warning("batch %s from %s: %s; nothing to send", _short(batch.root), batch.node, GONE)
            return True
        if found is Presence.HELD and record.status == BatchStatus.INVALIDATED:
            self.store.move_batch(batch, INVALIDATED, note="already invalidated on chain")
            return True
        if found is Presence.OVERWRITTEN or record.status != BatchStatus.PENDING:
            self.store.move_batch(batch, REJECTED, note=f"the batch is {_settled(found, record)} on chain")
            return True
        window = await self._challenge_window()
        now = await asyncio.to_thread(self.ledger.timestamp)
        closes = challenge_closes_at(record.submitted_at, window)
        if now >= closes:
            note = f"the challenge window closed at {closes} (chain time {now})"
            self.store.move_batch(batch, REJECTED, note=note)
            log.warning("batch %s: rejected too late to act on chain: %s", _short(batch.root), note)
            return True
        return False

    def _keep_batch_evidence(self, batch: BatchRow) -> None:
        assert batch.reason is not None and batch.detail is not None
        proof = None if batch.leaf_index is None else self._proof(batch.leaves, batch.leaf_index)
        window = self._window if self._window is not None else int(self.config.grace_seconds)
        self.evidence.keep_batch(
            batch.root,
            slot=batch.slot,
            node=batch.node,
            leaves=batch.leaves,
            reason=batch.reason,
            detail=batch.detail,
            proof=proof,
            kept_until=challenge_closes_at(batch.submitted_at, window) + EVIDENCE_SLACK_SECONDS,
        )

    def _proof(self, leaves: bytes | None, index: int) -> LeafProof:
        """Leaf `index`'s Merkle proof, from the leaf list kept with its batch."""
        assert leaves is not None  # a batch is listed, or rejected at a leaf, only with its list kept
        return BatchTree(decode_leaves(leaves, max_leaves=len(leaves))).proof(index)

    def _batch_proof(self, row: WorkRow) -> LeafProof:
        """The proof of a listed file's leaf in its batch."""
        assert row.leaf_index is not None
        batch = self.store.get_batch(_root(row), row.node, _in_slot(row).slot)
        assert batch is not None  # leaf rows are written with their batch's list
        return self._proof(batch.leaves, row.leaf_index)

    def _retry_batch(self, batch: BatchRow, error: str, *, before: float | None = None) -> None:
        delay = retry_delay(batch.attempts)
        if before is not None:
            delay = max(0.0, min(delay, before - time.time()))
        self.store.retry_batch_later(batch, delay, error)

    def _retry(self, row: WorkRow, error: str, *, before: float | None = None) -> None:
        delay = retry_delay(row.attempts)
        if before is not None:
            delay = max(0.0, min(delay, before - time.time()))
        self.store.retry_later(row, delay, error)

    # --- verification -------------------------------------------------------------------------------

    async def _verify(self, row: WorkRow) -> None:
        """One submission, from the chain to a recorded verdict: still on chain, not judged by a peer, its file and the
        coordinator's step history, the checks, the verdict (its evidence kept first when it rejects). A failure on
        this validator's side is retried or recorded unverifiable in the stage that met it, never a verdict."""
        if not await self._still_submitted(row):
            return
        if len(self.peers.validators) > 1 and await self._judged_elsewhere(row):
            return
        trace.record("queue", max(0.0, time.time() - row.first_seen), key=row.work_key.hex(), attempts=row.attempts)
        fetched = await self._fetch(row)
        if fetched is None:
            return
        data, history = fetched
        expected = self._expected(row, history)
        judged = await self._judge(row, data, expected)
        if judged is None:
            return
        verdict, seconds = judged
        await self._record(row, verdict, seconds, data, expected)

    async def _still_submitted(self, row: WorkRow) -> bool:
        """Whether the file's batch was submitted (a reorganisation may have removed it: judged only if it is
        submitted again); False too when the chain could not be read (retried). A batch settled and written over
        since was submitted: its window has closed, so nothing goes on chain, but the file is judged and attested
        all the same, for training, as any file judged after its window."""
        try:
            found, _ = await self._read_slot(row.node, _in_slot(row))
        except LedgerError as exc:
            self._retry(row, f"reading the batch on chain: {exc}")
            return False
        if found is Presence.GONE:  # read from a block a reorganisation replaced
            self.store.move(row, UNVERIFIABLE, note=GONE)
            self._gone.inc()
            log.warning("%s from %s: %s; judged if it is submitted again", _short(row.work_key), row.node, GONE)
            return False
        return True

    async def _fetch(self, row: WorkRow) -> tuple[bytes, list[PublishedStep]] | None:
        """The file and the coordinator's step history, or None when the row went elsewhere: retried (the
        coordinator failed, or has not got the file yet inside the grace period), unverifiable (the coordinator
        acknowledged the file and lost it: never the worker's fault), or rejected unavailable (reason 8: never
        uploaded within the grace period)."""
        key, short = row.work_key, _short(row.work_key)
        try:
            with trace.span("download", key=key.hex()):
                data = await self.client.download(key, self.config.max_file_bytes)
                history = await self.client.steps() if data is not None else []
        except CoordinatorLostFile as exc:  # stored and acknowledged, then lost there: never the worker's fault
            self._unjudged(row, str(exc))
            return None
        except CoordinatorError as exc:  # not the worker's fault: try again, whatever the grace period
            log.warning("%s: the coordinator failed, trying again: %s", short, exc)
            self._retry(row, str(exc))
            return None
        if data is not None:
            return data, history
        deadline = row.first_seen + self.config.grace_seconds
        if time.time() < deadline:
            self._retry(row, "the coordinator does not have the file yet", before=deadline)
            return None
        verdict = reject(
            Reason.FILE_UNAVAILABLE,
            DOWNLOAD,
            f"the coordinator did not have the file {self.config.grace_seconds:g} s after the submission was seen",
            attempts=row.attempts + 1,
        )
        self.store.record_verdict(row, verdict, stage=UNAVAILABLE)
        self._unavailable.inc()
        log.info("%s from %s: unavailable after %d tries", short, row.node, row.attempts + 1)
        return None

    def _expected(self, row: WorkRow, history: list[PublishedStep]) -> Expected:
        """What the file must agree with: the chain's record of it, the pool's terms, and the steps the coordinator
        had published around the submission's block time (unknown steps are never held against the worker)."""
        earliest, current = steps_around(history, row.submitted_at, self.config.clock_slack)
        if current is None:
            log.warning(
                "%s: the coordinator's step history starts after block %d (time %d): not judging its step",
                _short(row.work_key), row.block, row.submitted_at,
            )  # fmt: skip
        return Expected(
            work_key=row.work_key,
            node=row.node,
            pool_id=self.setup.pool_id,
            units=row.units,
            current_step=current,
            earliest_step=0 if earliest is None and current is not None else earliest,  # unknown: never stale
            trainer=self.setup.trainer,  # the file's assignment must be one the trainer signed
            domain=self.domain,
            submitted_at=row.submitted_at,  # the block's time: past the signed assignment's deadline, it is stale
            timing=self.setup.timing,
        )

    async def _judge(self, row: WorkRow, data: bytes, expected: Expected) -> tuple[Verdict, float] | None:
        """The checks of validator.verify on the file, in a thread, with the seconds they took; None when this
        validator could not judge it (a checkpoint gone from every source, or its own failure: never a verdict)."""
        short = _short(row.work_key)
        loop = asyncio.get_running_loop()

        def checkpoint_of(step: int) -> LoadedModel:  # called in the verification thread
            return asyncio.run_coroutine_threadsafe(self.checkpoints.get(step), loop).result()

        started = time.perf_counter()
        try:
            verdict = await interruptible(
                lambda: verify_file(
                    data,
                    spec=self.setup.task,
                    checkpoint=checkpoint_of,
                    config=self.config,
                    expected=expected,
                    source=self.source,
                ),
                self.stopping,
            )
        except CheckpointGone as exc:
            self._unjudged(row, str(exc))
            return None
        except (Stopped, MemoryShortfall):  # a shortfall: no file of the pool could be judged here
            log.info("%s: stopping; its verification is dropped and runs again after a restart", short)
            raise
        except Exception as exc:  # the validator's side failed: never a verdict (validator.errors.CouldNotJudge)
            failure = exc if isinstance(exc, CouldNotJudge) else CouldNotJudge.during("verify", exc, what="verifying")
            self._could_not_judge(row, failure)
            return None
        seconds = time.perf_counter() - started
        trace.record("verify", seconds, key=row.work_key.hex(), accepted=verdict.accepted)
        self._verify_seconds.inc(seconds)
        self._last_verify.set(seconds)
        return verdict, seconds

    async def _record(self, row: WorkRow, verdict: Verdict, seconds: float, data: bytes, expected: Expected) -> None:
        """Records the verdict (a second file under one assignment counter is rejected here); a rejection's evidence
        is on disk before the row can go on chain, and a failure to keep it retries the row rather than skip it."""
        short = _short(row.work_key)
        if verdict.accepted:  # one assignment pays once: a second file under the node's counter is a re-slice
            verdict = self._counter_once(row, verdict)
        if not verdict.accepted:  # the evidence exists before anything can go on chain
            # the leaf's proof is read from the store here, on the loop's thread: SQLite's connection is its own
            batch = (_in_slot(row), self._batch_proof(row))
            try:
                await asyncio.to_thread(self._keep_evidence, data, verdict, expected, row, batch)
            except Exception as exc:  # a full disk, memory: this validator's failure, never a reason to skip evidence
                log.warning("%s: keeping the evidence of its rejection failed, verifying again later: %s", short, exc)
                self._retry(row, f"keeping evidence: {exc}")
                return
        self.store.record_verdict(row, verdict)
        if verdict.accepted:
            self._accepted.inc()
            current = expected.current_step
            log.info("%s from %s: accepted in %.2f s (pool step %s then)", short, row.node, seconds, current)
        else:
            assert verdict.reason is not None  # a rejecting verdict has a reason
            self._rejected.inc(reason=verdict.reason.name.lower())
            log.info(
                "%s from %s: rejected, %s (reason %d) at %s: %s",
                short, row.node, verdict.reason.name.lower(), verdict.reason, verdict.check, verdict.detail,
            )  # fmt: skip

    def _could_not_judge(self, row: WorkRow, failure: CouldNotJudge) -> None:
        """A verification that failed on this validator's side: tried again with back-off, and after
        `judge_attempts` such failures recorded unverifiable. Never attested, never invalidated."""
        self._not_judged.inc(cause=str(failure.cause))
        failures = self.store.count_unjudged(row)
        short = _short(row.work_key)
        if failures < self.config.judge_attempts:
            delay = retry_delay(failures)
            self.store.retry_later(row, delay, f"could not judge ({failure.cause}): {failure}")
            log.warning("%s: could not judge it on this side (%d of %d tries), trying again in %g s: %s",
                        short, failures, self.config.judge_attempts, delay, failure)  # fmt: skip
            return
        self._unjudged(row, f"could not judge it in {failures} tries, the last one: {failure}")

    def _unjudged(self, row: WorkRow, note: str) -> None:
        """The file cannot be judged here, for a reason of this validator's side (`note`): its row ends unverifiable,
        `Outcome.UNJUDGED`, which is never attested and sends nothing on chain (`validator.verdict.sanction`)."""
        self.store.record_unjudged(row, note)
        self._unverifiable.inc()
        log.warning("%s from %s: unverifiable, never invalidated: %s", _short(row.work_key), row.node, note)

    def _counter_once(self, row: WorkRow, verdict: Verdict) -> Verdict:
        """The verdict, or reason 3 when another file of this node already used the file's assignment counter."""
        counter = int(verdict.evidence["counter"])
        first = self.store.use_counter(row, counter)
        if first == row.work_key:
            return verdict
        return reject(
            Reason.WRONG_ASSIGNMENT,
            ASSIGNMENT,
            f"assignment counter {counter} of node {row.node} was already used by work 0x{first.hex()}",
            counter=counter,
            first=f"0x{first.hex()}",
        )

    def _keep_evidence(
        self,
        data: bytes,
        verdict: Verdict,
        expected: Expected,
        row: WorkRow,
        batch: tuple[SlotBatch, LeafProof] | None,
    ) -> None:
        """In a worker thread: the file, the verdict and the checkpoint of its step, until its window closes; for a
        leaf of a batch, `batch` is the batch (its slot and root) and the leaf's proof."""
        try:
            step: int | None = read_rollouts(data, max_bytes=self.config.max_file_bytes).rows[0].step
        except RolloutFormatError as exc:
            if exhausted(exc) is not None:  # out of memory re-reading it: evidence without its checkpoint would not do
                raise
            step = None  # rejected before any checkpoint was needed
        except IndexError:
            step = None
        checkpoint = None if step is None else self.checkpoints.path_of(step)
        window = self._window if self._window is not None else int(self.config.grace_seconds)
        self.evidence.keep(
            data,
            verdict,
            expected=expected,
            config=self.config,
            task=self.setup.task.path,
            task_hash=spec_hash(self.setup.task),
            kept_until=challenge_closes_at(row.submitted_at, window) + EVIDENCE_SLACK_SECONDS,
            step=step,
            checkpoint=checkpoint if checkpoint is not None and checkpoint.is_dir() else None,
            manifest_hash=self.checkpoints.manifest_hash(step) if step is not None else None,
            batch=batch,
        )
        self.evidence.prune(time.time())

    # --- attestation and invalidation ---------------------------------------------------------------

    async def _attest(self, row: WorkRow) -> None:
        if names_another_node(row.check, row.detail):
            # A record of another node's key (a squatter): its invalidation goes on chain, but an attestation is on
            # the file, which is the other node's and judged under that node's record.
            self.store.move(row, ATTESTED)
            log.warning("%s from %s: another node's file; invalidating the record, not attesting the file",
                        _short(row.work_key), row.node)  # fmt: skip
            return
        accepted = bool(row.accepted)
        attestation = Attestation(self.setup.pool_id, row.work_key, accepted, 0 if accepted else int(row.reason or 0))
        try:
            with trace.span("attest", key=row.work_key.hex(), accepted=accepted):
                await self.client.attest(attestation)
        except CoordinatorRefused as exc:  # e.g. the coordinator's view of the validators lags: the chain decides
            log.error("%s: the coordinator refused the attestation: %s", _short(row.work_key), exc)
        except CoordinatorError as exc:
            log.warning("%s: posting the attestation failed, trying again: %s", _short(row.work_key), exc)
            self._retry(row, str(exc))
            return
        self.store.move(row, ATTESTED)  # a rejection then goes on chain: invalidated, or refused when borderline
        if row.outcome is Outcome.BORDERLINE:  # refused for training by this attestation, for payment by refuseLeaf
            self._borderline.inc()
            log.warning("%s from %s: borderline: refused for training and payment, not slashed (prime-validate "
                        "explain shows why): %s", _short(row.work_key), row.node, row.detail)  # fmt: skip
        if self.gossip is not None:
            await self.gossip.publish(attestation)

    async def _invalidate(self, row: WorkRow) -> None:
        """Sends what the row's outcome calls for (`validator.verdict.sanction`), with the file's Merkle proof:
        invalidateBatch for a slashable rejection (the whole batch void), refuseLeaf for a borderline one (its units
        not paid, nothing slashed), and nothing for any other outcome; unless the chain says it is done or too late."""
        ledger, pool_id, short = self.ledger, self.setup.pool_id, _short(row.work_key)
        action = None if row.outcome is None else sanction(row.outcome)
        if action is None:  # accepted, or never judged: the store hands no such row to this stage
            return
        assert row.reason is not None  # a rejection always carries a reason
        reason = Reason(row.reason)
        name = str(action)
        if row.slash_after is None and self._wait_for_primary(row):
            return
        try:
            if await self._settled_on_chain(row, action):
                return
            proof = self._batch_proof(row)
            send = ledger.invalidate_batch if action is Sanction.INVALIDATE else ledger.refuse_leaf
            receipt = await asyncio.to_thread(
                partial(send, slot=_in_slot(row).slot), pool_id, row.node, _root(row), proof, reason
            )
        except ContractRevert as exc:  # judged by another validator meanwhile, or the window closed: ask again
            log.warning("%s: %s reverted: %s", short, name, exc)
            with contextlib.suppress(LedgerError):
                if await self._settled_on_chain(row, action):
                    return
            self._retry(row, str(exc))
            return
        except LedgerError as exc:
            log.warning("%s: %s failed, trying again: %s", short, name, exc)
            self._retry(row, str(exc))
            return
        tx = "0x" + bytes(receipt["transactionHash"]).hex()
        if action is Sanction.REFUSE:
            self.store.move(row, REFUSED, tx_hash=tx)
            self._refusals.inc()
            log.info("%s: refused (%s, reason %d) in %s; node %s neither paid for it nor slashed", short,
                     reason.name.lower(), reason, tx, row.node)  # fmt: skip
            return
        self.store.move(row, INVALIDATED, tx_hash=tx)
        self._invalidations.inc()
        log.info("%s: invalidated (%s, reason %d) in %s; node %s slashed and ejected", short, reason.name.lower(),
                 reason, tx, row.node)  # fmt: skip

    def _wait_for_primary(self, row: WorkRow) -> bool:
        """A replica that is not the key's primary waits `rank x takeover_seconds` (at most half the window left)
        before it reads the chain and invalidates (or refuses): the primary's transaction lands first, and a second
        one is never sent. Returns whether the row now waits."""
        if len(self.peers.validators) == 1:
            return False
        now, replication = time.time(), self.setup.replication
        delay = self.peers.slash_delay(row.work_key, replication, now)
        if delay is None:  # no longer one of the key's replicas (a validator came back): after all of them
            delay = replication * self.config.takeover_seconds
        if self._window is not None:
            delay = min(delay, max(0.0, (challenge_closes_at(row.submitted_at, self._window) - now) / 2))
        self.store.slash_at(row, now + delay)
        if delay > 0:
            log.info("%s: rejected; waiting %.0f s for the key's primary validator to invalidate it first",
                     _short(row.work_key), delay)  # fmt: skip
        return delay > 0

    async def _settled_on_chain(self, row: WorkRow, action: Sanction) -> bool:
        """Records and returns True when nothing is left to send: the file's batch invalidated (by this file or
        another), its leaf refused already when a refusal is all there is to send, the batch no longer pending, or
        its window closed. A clear rejection of a refused leaf is still sent: a refusal never shields a slash
        (WorkLedger)."""
        assert row.leaf_index is not None  # a file row is a leaf of its batch
        ledger, pool_id, short, root = self.ledger, self.setup.pool_id, _short(row.work_key), _root(row)
        found, batch = await self._read_slot(row.node, _in_slot(row))
        if found is Presence.GONE:  # judged again if a reorganisation brings its batch back
            self.store.move(row, ATTESTED, note=GONE)
            log.warning("%s: %s; nothing to send", short, GONE)
            return True
        if found is Presence.OVERWRITTEN:
            note = f"its batch is {_settled(found, batch)} on chain; nothing to send"
            self.store.move(row, ATTESTED, note=note)
            log.warning("%s: %s", short, note)
            return True
        if batch.status == BatchStatus.INVALIDATED:
            self.store.move(row, INVALIDATED, note="its batch is already invalidated on chain")
            log.info("%s: its batch %s is already invalidated on chain; not sending it again", short,
                     _short(root))  # fmt: skip
            return True
        if action is Sanction.REFUSE and await asyncio.to_thread(
            ledger.is_leaf_refused, pool_id, row.node, root, row.leaf_index
        ):
            self.store.move(row, REFUSED, note="already refused on chain")
            log.info("%s: already refused on chain; not sending it again", short)
            return True
        if batch.status != BatchStatus.PENDING:
            note = f"its batch is {batch.status.name.lower()} on chain; nothing to send"
            self.store.move(row, ATTESTED, note=note)
            log.warning("%s: %s", short, note)
            return True
        return await self._window_closed(row, batch.submitted_at)

    async def _window_closed(self, row: WorkRow, submitted_at: int) -> bool:
        """Records and returns True when the challenge window of a submission made at `submitted_at` has closed."""
        window = await self._challenge_window()
        now = await asyncio.to_thread(self.ledger.timestamp)
        closes = challenge_closes_at(submitted_at, window)
        if now >= closes:  # pending, past its window
            note = f"the challenge window closed at {closes} (chain time {now})"
            self.store.move(row, ATTESTED, note=note)
            log.warning("%s: rejected too late to act on chain: %s", _short(row.work_key), note)
            return True
        return False


def _short(work_key: bytes) -> str:
    return "0x" + work_key.hex()[:12]


def _settled(found: Presence, record: BatchRecord) -> str:
    """How the chain settled a batch no longer pending, for a note: "claimed", "invalidated", or written over."""
    if found is Presence.OVERWRITTEN:
        return "settled, its slot written over by a later batch,"
    return record.status.name.lower()


def _in_slot(row: WorkRow) -> SlotBatch:
    """The batch `row`'s file is a leaf of, as its slot holds it (a row without one was never read from chain)."""
    if row.slot is None:
        raise ValueError(f"0x{row.work_key.hex()} from {row.node} is in no batch slot: not read from this chain")
    return SlotBatch(row.slot, _root(row), row.submitted_at)


def _root(row: WorkRow) -> bytes:
    """The root of the batch `row`'s file is a leaf of: every file on chain is (a batch of one is the single-file
    case); a row without one was never read from the chain."""
    if row.root is None:
        raise ValueError(f"0x{row.work_key.hex()} from {row.node} is in no batch: not a submission read from chain")
    return row.root
