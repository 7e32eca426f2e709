"""The worker daemon: checks its standing on chain, then loops fetch -> assignment -> generate -> upload -> submit.

One iteration (DESIGN section 1, steps 2 to 4):
1. ask the coordinator for an assignment (it picks the step and the counter); one the pool's trainer did not sign,
   or whose signed issue time is off this node's clock by more than the pool's clock slack, is refused before any
   generation (`check_assignment`; the latter is the coordinator's fault: logged, and asked again);
2. hold the weights of that step: fetched through SHARDCAST from the pool's checkpoint sources, the manifest's
   signature checked against the pool's trainer (`node.daemon.weights`);
3. generate the file with proofs (the code of `prime-node generate`), write it into the state folder, record it;
4. upload it (signed; idempotent), record that;
5. submit uploaded files on chain in batches of `submit_batch` (or what is ready after `submit_every` seconds): a
   batch's composition is journaled first (`formed`: the same files always form the same Merkle root), its leaf
   list uploaded to the coordinator, which validators fetch it from (`listed`, the trainer's receipt kept), then its
   root recorded on chain in the batch slot journaled with it (`submitted`; a slot the chain shows holding a pending
   batch the journal does not know is left for the next free one). Never a file whose assignment has expired by
   this node's clock or the chain head's (`protocol.terms.AssignmentTiming.submit_by`: validators would reject it as
   stale and slash the stake) nor one whose step has left the pool's window (nobody trains on it): it expires
   instead;
6. follow the chain, batch by batch: an invalidation voids every file of the batch (journaled with the leaf shown
   bad and the reason), a refused leaf is journaled refused, a submission a reorganisation removed is submitted
   again with the same root into the same slot, and, when `claim` is on, batches whose challenge window has passed
   are claimed in one transaction (their slots free for the next batches).

With `relay_port` the node is also a SHARDCAST relay: it mirrors the pool's checkpoint sources into its state
folder (every shard verified, only versions the pool's trainer signed) and serves them to other peers; its own
fetches then read from that relay first.

With `p2p_port` the node also joins the pool's gossip (`node.daemon.gossip`): it dials the bootstrap peers,
prefetches each step the trainer announces, adds advertised relays to its checkpoint sources, and, with a
relay, advertises it.

Everything is journaled in `node.daemon.state` before the next side effect, so a crash or a kill at any point
loses no file that was written, puts none in two batches and submits no root twice. SIGTERM or SIGINT finishes
the file in progress, uploads and submits what is ready, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from core import trace
from core.errors import NodeError
from core.metrics import Registry, serve_metrics
from core.signals import cancel_and_wait
from engine.generate import generate_rollouts
from engine.inference.select import Engine, choose
from engine.memory import MemoryShortfall, longest_sequence
from engine.model.loading import LoadedModel
from ledger.types import BatchRecord, BatchStatus
from node.daemon.batches import invalidation_details, void_detail
from node.daemon.chain import SlotInUse
from node.daemon.state import REFUSED_DETAIL, BatchEntry, FileRecord, WorkerState
from node.daemon.weights import Weights, memory_gate
from protocol.coordinator.client import (
    BatchUpload,
    CoordinatorBusy,
    CoordinatorClient,
    CoordinatorError,
    CoordinatorLostFile,
    CoordinatorRefused,
    CoordinatorUnavailable,
    NoWorkYet,
    Upload,
)
from protocol.coordinator.errors import ErrorCode
from protocol.plan import Job
from protocol.rollouts import RolloutRow, encode_rollouts
from protocol.rollouts.writer import publish_atomically
from protocol.signing import Assignment, SignatureError, SigningDomain, UploadReceipt, recover
from protocol.tasks.sources import TaskSource, open_source
from protocol.tasks.spec import TaskSpec, load_task_spec, spec_hash
from protocol.terms import AssignmentTiming, batch_state, step_window
from shardcast.sources import SourcePool
from shardcast.trust import TrustPolicy

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from node.config import WorkerSettings
    from node.daemon.chain import WorkChain
    from node.daemon.gossip import WorkerGossip
    from protocol.pool_spec import Pool
    from protocol.terms import StepWindow
    from shardcast.server import ShardServer

log = logging.getLogger("node.worker")

LOOPBACK = "127.0.0.1"  # where the metrics, the dashboard and the gossip host listen: this machine only
# Slots one submission tries before it gives up for this turn: each `SlotInUse` refusal names a pending batch of this
# node the journal does not know and moves the batch to the next free slot, and a node has only so many such batches.
SLOT_TRIES = 33

# Serves the operator's page over a running daemon on (host, port), returning it and its URL. `prime-node start`
# passes `node.dashboard.worker.serve_worker_dashboard`: the dashboard reads the daemon, so the daemon never
# imports it (imports point node.daemon <- node.dashboard).
ServeDashboard = Callable[["WorkerDaemon", str, int], Awaitable[tuple[web.AppRunner, str]]]


class WorkerError(NodeError):
    """The worker cannot work in this pool (not registered, not a member, ejected); the message says what to do."""


class UntimelyAssignment(WorkerError):
    """A signed assignment whose issue time is off this node's clock by more than the pool's clock slack: the
    coordinator's fault (its clock, or a grant held back). Refused before generating; the worker asks again."""


@dataclass
class _Running:
    """What `WorkerDaemon.run` opened for its loop, and closes after it."""

    spec: TaskSpec
    source: TaskSource
    trainer: str  # the pool's trainer: it signs assignments, receipts and manifests
    domain: SigningDomain
    weights: Weights
    relay: tuple[str, ShardServer, asyncio.Task[None]] | None
    gossip: WorkerGossip | None
    metrics: web.AppRunner | None
    dashboard: web.AppRunner | None


class WorkerDaemon:
    """The loop of the module docstring, over a `WorkChain`: the pool's contracts (`LedgerWorkChain`, `prime-node
    start`) or none (`LocalWorkChain`, local mode). Deliberate misbehaviour overrides the three hooks below
    (`weights_on_load`, `finish_rows`, `submittable`) from outside: `node.daemon.faults.FaultyWorker`."""

    def __init__(
        self,
        settings: WorkerSettings,
        pool: Pool,
        chain: WorkChain,
        account: LocalAccount,
        *,
        dashboard: ServeDashboard | None = None,
        memory_budget: int | None = None,
    ) -> None:
        """`memory_budget` (bytes): plan within it instead of what is free on the device (`--memory-budget`)."""
        if settings.dashboard_port is not None and dashboard is None:
            raise ValueError("dashboard_port is set but no dashboard was given to serve on it")
        if not pool.endpoints.checkpoints:
            raise ValueError("the worker needs at least one checkpoint source")
        self.settings = settings
        self.terms, self.endpoints = pool.terms, pool.endpoints  # binding, and where the pool's parts are
        self.pool_id = pool.terms.pool_id
        self.state_dir = settings.state_dir(self.pool_id, account.address)
        self._dashboard = dashboard
        self.memory_budget = memory_budget
        self.chain = chain
        self.account = account
        self.node = account.address
        self.stopping = asyncio.Event()
        self.state = WorkerState(self.state_dir, chain_id=chain.domain.chain_id, pool_id=self.pool_id, node=self.node)
        self.metrics = Registry()
        self._files = self.metrics.counter("worker_files_total", "Files generated by this process.")
        self._failures = self.metrics.counter("worker_failures_total", "Failed iterations, by kind.")
        self._untimely = self.metrics.counter(
            "worker_assignments_refused_total",
            "Signed assignments refused as off this node's clock, nothing generated.",
        )
        self._generate_seconds = self.metrics.counter("worker_generate_seconds_total", "Seconds spent generating.")
        self._restored = self.metrics.counter(
            "worker_files_restored_total", "Submitted files uploaded again after the coordinator lost them."
        )
        self._lists_restored = self.metrics.counter(
            "worker_batch_lists_restored_total", "Leaf lists of batches listed again after the coordinator lost them."
        )
        self._stage = self.metrics.gauge("worker_files", "Files in the journal, by stage.")
        self._batch_stage = self.metrics.gauge("worker_batches", "Batches in the journal, by stage.")
        self.metrics.gauge("worker_step", "The policy step of the weights held.", lambda: float(self._held_step))
        self._held_step = -1
        self._idle_logged = -2  # the held step when 'no more work' was last logged
        self._made = 0  # files this process made (`max_files`)
        self._started_at = time.time()
        self._waiting_since: float | None = None  # when the oldest uploaded, unsubmitted file became ready
        self._last_chain_look = 0.0
        self._window = 0
        # slots the chain showed holding a pending batch of this node that the journal does not know (a journal
        # restored from an older copy): no batch is formed or sent into them while this process runs
        self._foreign_slots: set[int] = set()
        self._receipts_from: tuple[str, SigningDomain] | None = None  # (trainer, domain), known once running
        self._coordinator: CoordinatorClient | None = None
        # in the pool's precision (its task's sampling.dtype), whatever the device; refuses what this machine cannot
        # run, up front
        spec = load_task_spec(pool.endpoints.task_path)
        self.choice = choose(settings.backend, settings.device, dtype=spec.sampling.dtype)
        self.engine = Engine(
            self.choice,
            batch_size=settings.batch_size,
            sequence_tokens=lambda tokenizer: longest_sequence(spec, open_source(spec), tokenizer),
        )
        self._weight_loads = self.metrics.counter(
            "worker_weight_loads_seconds_total", "Seconds spent putting new policies into the inference engine."
        )

    # --- what an honest worker does (node.daemon.faults.FaultyWorker overrides these) -----------------

    def weights_on_load(self) -> Callable[[LoadedModel], None] | None:
        """Called on each policy `Weights.hold` loads, before generation sees it: nothing to do."""
        return None

    def finish_rows(self, rows: list[RolloutRow], *, vocab_size: int) -> list[RolloutRow]:
        """The rows of the file, as generated."""
        return rows

    def submittable(self, ready: list[FileRecord], window: StepWindow, *, now: float | None = None) -> list[FileRecord]:
        """The uploaded files whose assignment has not expired by `now` (default: this node's clock) and whose step
        is inside the pool's step window; the others are journaled as expired, never submitted. Past its
        assignment's deadline a file is stale by the trainer's signature and validators must slash it; outside the
        window nobody trains on it, and validators refuse it unpaid."""
        timing, now = self.terms.timing, time.time() if now is None else now
        issued = {r.work_key: r.issued_at for r in ready if r.issued_at is not None}
        late = {key: at for key, at in issued.items() if now > timing.submit_by(at)}
        for key, issued_at in late.items():
            detail = f"its assignment (issued at {issued_at}) expired at {timing.submit_by(issued_at)}"
            self.state.move([key], "expired", detail=detail)
        if late:
            log.warning("%d files' assignments have expired; not submitting them", len(late))
        ready = [r for r in ready if r.work_key not in late]
        stale = [r for r in ready if r.step not in window]
        if stale:
            self.state.move([r.work_key for r in stale], "expired", detail=f"step < {window.oldest} when submitting")
            log.warning("%d files fell out of the window %s; not submitting them", len(stale), window)
        return [r for r in ready if r.step in window]

    # --- standing on chain --------------------------------------------------------------------------

    async def check_standing(self) -> None:
        """Registered with a provider, a member of the pool (joining when asked), not ejected."""
        chain, pool_id = self.chain, self.pool_id
        provider = await asyncio.to_thread(chain.provider_of, self.node)
        if provider is None:
            raise WorkerError(
                f"node {self.node} is not bound to a provider: pass --register with the provider's key "
                "(--provider-keystore FILE), or run `prime-node register --node-keystore FILE` as the provider"
            )
        if await asyncio.to_thread(chain.is_member, pool_id, self.node):
            return
        if await asyncio.to_thread(chain.is_ejected, pool_id, self.node):
            raise WorkerError(
                f"node {self.node} was ejected from pool {pool_id} and cannot rejoin; unless an invalidation ejected "
                f"it, `prime-node claim {pool_id}` still claims its earlier work after its challenge window"
            )
        if not self.settings.join:
            raise WorkerError(f"node {self.node} is not a member of pool {pool_id}: pass --join, or `prime-node join`")
        stake = await asyncio.to_thread(chain.stake_of, provider)
        minimum = (await asyncio.to_thread(chain.pool, pool_id)).config.min_stake_per_node
        if stake.active - stake.locked < minimum:
            from ledger.units import format_amount as format_tokens

            free, need = (format_tokens(v, chain.decimals) for v in (stake.active - stake.locked, minimum))
            raise WorkerError(
                f"provider {provider} has {free} tokens of stake free and pool {pool_id} locks {need} per node: "
                "stake more (`prime-node register --stake N`, or --register --stake N here)"
            )
        await asyncio.to_thread(chain.join, pool_id)
        log.info("joined pool %d as %s (provider %s)", pool_id, self.node, provider)

    # --- the loop -----------------------------------------------------------------------------------

    async def run(self) -> int:
        """Works until stopped; returns the exit code (0 stopped or done, 1 cannot go on).

        Each turn of the loop makes one file (`_one_file`); what can go wrong in a turn is handled here, by kind: a
        refusal or an ejection stops the worker, an untimely assignment or no work yet waits, an unreachable
        coordinator is retried up to `patience`, anything else up to `max_failures` turns in a row."""
        settings = self.settings
        try:
            running = await self._open()
        except WorkerError:
            if await self._ejected():  # what the chain says of its batches, journaled before it stops
                await self._explain_ejection()
            raise
        failures = 0
        unreachable_since: float | None = None  # since when the coordinator has not answered
        try:
            # a session of its own: every call timed and bounded (protocol.coordinator.client.ClientLimits)
            async with CoordinatorClient.connect(
                self.endpoints.coordinator, self.account, running.domain, pool_id=self.pool_id
            ) as coordinator:
                self._coordinator = coordinator
                recovered = False  # what a previous run left written or uploaded goes first
                while not self.stopping.is_set() and (settings.max_files is None or self._made < settings.max_files):
                    try:
                        if not recovered:
                            await self.flush(coordinator, force=True)
                            recovered = True
                        await self._one_file(coordinator, running)
                        failures, unreachable_since = 0, None
                    except CoordinatorRefused as exc:
                        await self._explain_refusal(exc)
                        return 1
                    except UntimelyAssignment as exc:  # the coordinator's clock: nothing generated, nothing lost
                        self._untimely.inc()
                        log.warning("refused an assignment, generating nothing for it: %s", exc)
                        await self._pause()
                    except NoWorkYet as exc:  # this step's share is done: submit what waits, then ask again
                        unreachable_since = None
                        await self._flush_while_idle(coordinator)
                        await self._wait_for_work(exc)
                    except (CoordinatorUnavailable, OSError) as exc:
                        self._failures.inc(kind="unreachable")
                        now = time.monotonic()
                        unreachable_since = unreachable_since or now
                        if settings.patience is not None and now - unreachable_since > settings.patience:
                            log.info("the coordinator has been unreachable for %.0f s; stopping (%s)",
                                     settings.patience, exc)  # fmt: skip
                            break
                        log.warning("coordinator unreachable, retrying: %s", exc)
                        await self._pause()
                    except MemoryShortfall:  # the pool's model does not fit here: no later turn would fit it
                        raise
                    except Exception as exc:  # a fetch that failed, a version pruned meanwhile, an RPC error
                        if await self._ejected():  # e.g. submitBatch reverted: NotPoolMember
                            await self._explain_ejection()
                            return 1
                        failures += 1
                        self._failures.inc(kind="iteration")
                        if failures >= settings.max_failures:
                            log.error("giving up after %d failures in a row; the last: %s", failures, exc)
                            return 1
                        log.warning("retrying after: %s", exc)
                        await self._pause()
                await self._finish(coordinator)
        finally:
            await self._close(running)
        log.info("stopped after %d files; journal: %s", self._made, self.state.counts())
        return 0

    async def _open(self) -> _Running:
        """The pool's record, the task, the weights and what the worker serves (relay, gossip, metrics, dashboard)."""
        pool = await asyncio.to_thread(self.chain.pool, self.pool_id)
        self._window = pool.config.challenge_window  # following the chain needs it, even for a node refused below
        await self.check_standing()
        domain = self.chain.domain
        self._receipts_from = (pool.config.trainer, domain)  # who signs upload receipts, under which domain
        spec = load_task_spec(self.endpoints.task_path)
        source = open_source(spec)
        policy = TrustPolicy(domain, pool.config.trainer, self.pool_id)
        sources = list(self.endpoints.checkpoints)
        relay = await self._start_relay(policy)
        if relay is not None:
            sources.insert(0, relay[0])  # once mirrored, the fastest source: loopback
        device, dtype = self.choice.torch_placement
        weights = Weights(
            self.state_dir / "weights",
            SourcePool(sources),
            policy,
            on_load=self.weights_on_load(),
            # a policy this device cannot hold stops the worker before it loads, not mid-file (engine.memory)
            before_load=memory_gate(
                spec,
                source,
                self.choice,
                batch_size=self.settings.batch_size,
                file_rows=self.terms.prompts_per_task * self.terms.group_size,
                prefetch=self.settings.p2p_port is not None,
                budget=self.memory_budget,
            ).check,
            device=device,
            dtype=dtype,
        )
        running = _Running(
            spec=spec,
            source=source,
            trainer=pool.config.trainer,
            domain=domain,
            weights=weights,
            relay=relay,
            gossip=await self._start_gossip(domain, pool.config.trainer, weights, relay),
            metrics=await self._serve_metrics(),
            dashboard=await self._serve_dashboard(),
        )
        per_key = [r for r in self.state.in_stage("submitted") if r.root is None]
        if per_key:  # a journal from before batches: records of a ledger with per-key work, which this one has not
            log.warning("%d files of this journal were submitted key by key, to a ledger from before batches; this "
                        "worker neither follows nor claims them", len(per_key))  # fmt: skip
        slotless = [b for b in self.state.batches_in_stage("submitted") if b.slot is None]
        if slotless:  # a journal from before slots: batches of a ledger whose records had no slot
            log.warning("%d batches of this journal were submitted to a ledger from before batch slots; this worker "
                        "neither follows nor claims them", len(slotless))  # fmt: skip
        log.info(
            "node %s in pool %d (trainer %s): coordinator %s, checkpoints %s, task %s, state %s; journal %s; "
            "generating with %s",
            self.node,
            self.pool_id,
            pool.config.trainer,
            self.endpoints.coordinator,
            ", ".join(self.endpoints.checkpoints),
            spec.name,
            self.state_dir,
            self.state.counts(),
            self.choice.describe(),
        )
        return running

    async def _one_file(self, coordinator: CoordinatorClient, running: _Running) -> None:
        """One turn: an assignment checked, the policy of its step held, the file made, uploaded, submitted when a
        batch is due, and the chain followed for verdicts and claims."""
        job = await coordinator.request_task()
        check_assignment(job, running.spec, running.trainer, running.domain, self.terms.timing, now=time.time())
        with trace.span("hold", step=job.step):  # the loop's wait: nothing when prefetched
            loaded = await running.weights.hold(job.step)
        if self._held_step != job.step:
            hash_hex = running.weights.manifest_hash.hex()[:12]
            log.info("holding the policy of step %d (manifest 0x%s)", job.step, hash_hex)
        self._held_step = job.step
        work_key = await self._make_file(job, running.spec, running.source, loaded, running.weights.manifest_hash)
        self._made += 1  # counted once written: `max_files` bounds the files made, whatever happens to them next
        await self._upload(coordinator, work_key)
        await self.flush(coordinator, force=False)
        await self.follow_chain()

    async def _flush_while_idle(self, coordinator: CoordinatorClient) -> None:
        """Submits what waits while there is no work; an outage or an RPC error here is retried like any other."""
        try:
            await self.flush(coordinator, force=True)
        except Exception as failure:
            self._failures.inc(kind="flush")
            log.warning("submitting what waits failed, trying again: %s", failure)

    async def _finish(self, coordinator: CoordinatorClient) -> None:
        """At a stop: the chain first (a submission a reorganisation removed is submitted again by the flush), then
        everything uploaded and submitted; what fails is left to the next start, which does it first."""
        try:
            await self.follow_chain(force=True)
            await self.flush(coordinator, force=True)
        except Exception as exc:
            log.warning("stopping with files left to upload or submit; the next start does it: %s", exc)

    async def _close(self, running: _Running) -> None:
        if running.dashboard is not None:
            await running.dashboard.cleanup()
        if running.metrics is not None:
            await running.metrics.cleanup()
        if running.gossip is not None:
            await running.gossip.stop()
        if running.relay is not None:
            await self._stop_relay(running.relay)

    async def _wait_for_work(self, refusal: NoWorkYet) -> None:
        if self._idle_logged != self._held_step:
            self._idle_logged = self._held_step
            log.info("no more work at this step for now (%s); asking again every %.1f s", refusal, refusal.retry_after)
        with contextlib.suppress(TimeoutError), trace.span("wait", step=self._held_step):
            await asyncio.wait_for(self.stopping.wait(), refusal.retry_after)

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), self.settings.retry_seconds)

    async def _make_file(
        self, job: Job, spec: TaskSpec, source: TaskSource, loaded: LoadedModel, manifest_hash: bytes
    ) -> bytes:
        started = time.perf_counter()

        def build() -> tuple[bytes, int, int]:
            loads = self.engine.loads
            backend = self.engine.backend(loaded)
            if self.engine.loads != loads:
                self._weight_loads.inc(self.engine.last_load_seconds)
                trace.record("load", self.engine.last_load_seconds, step=job.step, into=self.choice.backend)
                log.info("put the policy of step %d into %s in %.2f s", job.step, self.choice.backend,
                         self.engine.last_load_seconds)  # fmt: skip
            generated = generate_rollouts(job, spec, source, loaded, backend, manifest_hash=manifest_hash)
            rows = self.finish_rows(generated.rows, vocab_size=backend.vocab_size)
            data = encode_rollouts(generated.meta, rows)
            if len(data) > self.terms.max_file_bytes:  # validators would refuse it unread and slash the stake
                raise WorkerError(
                    f"the file of step {job.step}, counter {job.counter} is {len(data)} bytes, over the pool's "
                    f"limit of {self.terms.max_file_bytes}: not uploading it"
                )
            key = hashlib.sha256(data).digest()
            publish_atomically(self.state.path_of(key), data)
            return key, rows[0].step, sum(len(r.output_tokens) for r in rows)

        work_key, step, units = await asyncio.get_running_loop().run_in_executor(self.engine.thread, build)
        self.state.add(work_key, step=step, counter=job.counter, units=units, issued_at=job.issued_at)
        self._files.inc()
        self._generate_seconds.inc(time.perf_counter() - started)
        log.info("wrote 0x%s: step %d, counter %d, %d units", work_key.hex()[:12], job.step, job.counter, units)
        return work_key

    async def _upload(self, coordinator: CoordinatorClient, work_key: bytes, *, again: bool = False) -> None:
        """Uploads the journal's file and keeps the receipt; a first upload moves it to "uploaded" (`again`: a
        submitted file the coordinator lost keeps its stage)."""
        data = await asyncio.to_thread(self.state.path_of(work_key).read_bytes)
        with trace.span("upload", key=work_key.hex()):
            upload = await coordinator.upload(work_key, data)
        self._keep_receipt(upload)
        if not again:
            self.state.move([work_key], "uploaded")
        log.info("uploaded 0x%s", work_key.hex()[:12])

    def _keep_receipt(self, upload: Upload) -> None:
        """The trainer's signed receipt beside the file (`<work key>.receipt`): proof of the upload if the
        coordinator loses it. One that does not recover to the pool's trainer is logged and not kept."""
        key = "0x" + upload.work_key.hex()[:12]
        if upload.receipt is None:
            log.warning("uploaded %s: the coordinator sent no receipt", key)
            return
        assert self._receipts_from is not None  # set by run() before any upload
        trainer, domain = self._receipts_from
        try:
            signer = recover(UploadReceipt(self.pool_id, upload.work_key, self.node), upload.receipt, domain)
        except SignatureError:
            signer = None
        if signer != trainer:
            log.warning("uploaded %s: the receipt is not the trainer's (%s); not kept", key, signer)
            return
        publish_atomically(self.state.path_of(upload.work_key).with_suffix(".receipt"), upload.receipt.hex().encode())

    # --- batches: formed, listed, submitted ---------------------------------------------------------

    async def flush(self, coordinator: CoordinatorClient, *, force: bool) -> None:
        """Uploads written files, resumes the batches a previous run (or a reorganisation) left formed or listed,
        then forms batches of uploaded files and submits them (all of them when `force`)."""
        for record in self.state.in_stage("written"):
            try:
                await self._upload(coordinator, record.work_key)
            except CoordinatorBusy as exc:  # e.g. over the node's upload quota: the rest wait in the journal
                log.warning("%d files wait in the journal to be uploaded: %s", len(self.state.in_stage("written")), exc)
                break
        resumed = self.state.batches_in_stage("formed", "listed")
        ready = self.state.unbatched()
        if not ready:
            self._waiting_since = None
        elif self._waiting_since is None:  # counted from the file's readiness, not from the last submission or start
            self._waiting_since = time.monotonic()
        due = force or len(ready) >= self.settings.submit_batch
        waited = time.monotonic() - self._waiting_since if self._waiting_since is not None else 0.0
        due = bool(ready) and (due or waited >= self.settings.submit_every)
        if not resumed and not due:
            return
        window = step_window(await coordinator.step(), self.terms.async_level)
        # the later of this node's clock and the chain's head: validators judge a submission by its block's time
        now = max(time.time(), await asyncio.to_thread(self.chain.timestamp))
        for batch in resumed:  # the same files, the same root: never two roots for one file
            await self._resume(coordinator, batch, window, now)
        if not due:
            return
        ready = self.submittable(self.state.unbatched(), window, now=now)
        for start in range(0, len(ready), self.settings.submit_batch):
            batch = self.state.form_batch(ready[start : start + self.settings.submit_batch], avoid=self._foreign_slots)
            await self._submit(coordinator, batch)
        self._waiting_since = None

    async def _resume(self, coordinator: CoordinatorClient, batch: BatchEntry, window: StepWindow, now: float) -> None:
        """Submits a batch formed or listed before: unless the chain has it already (a crash after the transaction),
        or one of its files can no longer be submitted (its assignment expired meanwhile, its step left the window),
        in which case the batch is void, never sent, and its other files are batched again."""
        if await self._found_on_chain(batch):
            return
        members = self.state.members(batch.root)
        fresh = self.submittable(members, window, now=now)  # journals the others expired
        if len(fresh) < len(members):
            late = len(members) - len(fresh)
            detail = f"never submitted: {late} of its {len(members)} files could no longer be"
            self.state.move_batch(batch.root, "void", detail=detail)
            self.state.release(batch.root, [r.work_key for r in fresh])
            log.warning("batch 0x%s: %s; batching the other %d again", batch.root.hex()[:12], detail, len(fresh))
            return
        await self._submit(coordinator, batch)

    async def _submit(self, coordinator: CoordinatorClient, batch: BatchEntry) -> None:
        """Lists the batch's leaves with the coordinator (validators fetch them there), then records its root on
        chain unless this node already did, and journals it submitted with the transaction."""
        root = batch.root
        if batch.stage == "formed":
            await self._list(coordinator, batch)
        else:
            await self._restore_list(coordinator, batch)  # listed before: the coordinator may have lost it since
        for _ in range(SLOT_TRIES):
            if await self._found_on_chain(batch):
                return
            slot = _slot(batch)
            try:
                with trace.span("submit", root=root.hex(), files=batch.count, slot=slot):
                    tx = await asyncio.to_thread(
                        self.chain.submit_batch, self.pool_id, root, batch.count, batch.total_units, slot=slot
                    )
            except SlotInUse as exc:
                batch = self._leave_slot(batch, exc)
                continue
            self.state.move_batch(root, "submitted", tx=tx, files="submitted")
            log.info("submitted batch 0x%s of %d files (%d units) in slot %d in %s", root.hex()[:12], batch.count,
                     batch.total_units, slot, tx)  # fmt: skip
            return
        raise WorkerError(
            f"batch 0x{root.hex()[:12]}: the chain refused it in {SLOT_TRIES} slots in a row, each holding a "
            f"pending batch of this node (slots {sorted(self._foreign_slots)}); is another process submitting as "
            f"{self.node}? `prime-node status --address {self.node} --pool {self.pool_id}` lists its batches"
        )

    def _leave_slot(self, batch: BatchEntry, refused: SlotInUse) -> BatchEntry:
        """After a `SlotInUse`: journals the batch in the next free slot, leaving the one where the chain holds
        another pending batch of this node for as long as this process runs (a batch the journal does not know, or
        knows as settled: restored from an older copy?). A refusal for the batch's own root moves nothing: the next
        look finds it on chain."""
        if refused.root == batch.root:
            return batch
        self._foreign_slots.add(_slot(batch))
        slot = self.state.move_slot(batch.root, self._foreign_slots)
        known = self.state.batch(refused.root)
        which = "does not know" if known is None else f"holds as {known.stage}"
        log.warning("batch 0x%s: slot %d holds batch 0x%s of this node, pending on chain, which the journal %s "
                    "(restored from an older copy?); submitting into slot %d instead", batch.root.hex()[:12],
                    _slot(batch), refused.root.hex()[:12], which, slot)  # fmt: skip
        moved = self.state.batch(batch.root)
        assert moved is not None  # just moved
        return moved

    async def _found_on_chain(self, batch: BatchEntry) -> bool:
        """Whether this node already recorded `batch` in its slot on chain (a crash after the transaction, before the
        journal); journals it submitted if so. Records are per node: another node's batch of the same root is its
        own."""
        record = await asyncio.to_thread(self.chain.get_batch, self.pool_id, self.node, batch.root, slot=_slot(batch))
        if record.status == BatchStatus.NONE:
            return False
        detail = "found on chain after a restart"
        self.state.move_batch(batch.root, "submitted", detail=detail, files="submitted")
        log.info("batch 0x%s: %s", batch.root.hex()[:12], detail)
        return True

    async def _list(self, coordinator: CoordinatorClient, batch: BatchEntry) -> None:
        """Uploads the batch's leaf list and keeps the receipt; the coordinator stores it only while it holds every
        file the list names, so one it lost is uploaded again first."""
        leaves = [record.leaf for record in self.state.members(batch.root)]
        with trace.span("upload_batch", root=batch.root.hex(), files=batch.count):
            try:
                upload = await coordinator.upload_batch(leaves)
            except CoordinatorRefused as exc:
                if exc.code != ErrorCode.MISSING_FILES or not await self._restore_files(coordinator, batch.root):
                    raise
                upload = await coordinator.upload_batch(leaves)
        self._keep_batch_receipt(upload)
        if batch.stage == "formed":
            self.state.move_batch(batch.root, "listed")
        log.info("listed batch 0x%s of %d files with the coordinator", batch.root.hex()[:12], batch.count)

    async def _restore_files(self, coordinator: CoordinatorClient, root: bytes) -> bool:
        """Uploads again each file of batch `root` the coordinator no longer holds; whether there was one."""
        restored = False
        for record in self.state.members(root):
            if not await coordinator.holds(record.work_key):
                await self._upload(coordinator, record.work_key, again=True)
                self._restored.inc()
                restored = True
        return restored

    async def _restore_list(self, coordinator: CoordinatorClient, batch: BatchEntry) -> bool:
        """Uploads the batch's leaf list again when the coordinator no longer serves it (never stored: 404; lost:
        410); whether it did. Validators invalidate a batch whose list they cannot get (reason 8)."""
        try:
            served = await coordinator.download_batch(batch.root)
        except CoordinatorLostFile:
            served = None
        if served is not None:
            return False
        await self._list(coordinator, batch)
        self._lists_restored.inc()
        log.warning("batch 0x%s: its leaf list was gone from the coordinator; listed it again", batch.root.hex()[:12])
        return True

    def _keep_batch_receipt(self, upload: BatchUpload) -> None:
        """The trainer's signed receipt of the leaf list in `<root>.batch-receipt`: proof that the list was made
        available, should the coordinator lose it. One that does not recover to the pool's trainer is logged and not
        kept. (The client has checked that the answer is for this root and count.)"""
        short = "0x" + upload.root.hex()[:12]
        if upload.receipt is None:
            log.warning("listed batch %s: the coordinator sent no receipt", short)
            return
        assert self._receipts_from is not None  # set by run() before any upload
        trainer, domain = self._receipts_from
        signer = upload.receipt_signer(self.pool_id, self.node, domain)
        if signer != trainer:
            log.warning("listed batch %s: the receipt is not the trainer's (%s); not kept", short, signer)
            return
        publish_atomically(self.state.batch_receipt_path(upload.root), upload.receipt.hex().encode())

    # --- the chain's verdicts -----------------------------------------------------------------------

    async def follow_chain(self, *, force: bool = False) -> None:
        """Reads each submitted batch's record: invalidations and refused leaves are journaled with their reason,
        a batch a reorganisation removed goes back to be submitted again, and matured batches are claimed when
        configured to."""
        if not force and time.monotonic() - self._last_chain_look < self.settings.claim_every:
            self._update_stage_gauge()
            return
        self._last_chain_look = time.monotonic()
        chain, pool_id = self.chain, self.pool_id
        # one submitted to a ledger from before slots has none: this ledger does not hold it (warned at start)
        submitted = [b for b in self.state.batches_in_stage("submitted") if b.slot is not None]
        if submitted:
            now = await asyncio.to_thread(chain.timestamp)
            claimable: list[BatchEntry] = []
            for batch in submitted:
                record = await asyncio.to_thread(chain.get_batch, pool_id, self.node, batch.root, slot=_slot(batch))
                if record.status == BatchStatus.INVALIDATED:
                    await self._note_invalidation(batch)
                    continue
                if record.status in (BatchStatus.PENDING, BatchStatus.CLAIMED):
                    await self._note_refusals(batch, record)
                state = batch_state(record, self._window, now)
                if state == "claimed":
                    self.state.move_batch(batch.root, "claimed", files="claimed")
                elif state == "claimable":
                    claimable.append(batch)
                elif state == "pending":
                    await self._check_availability(batch)
                elif state == "none" and await asyncio.to_thread(self._submission_gone, batch):
                    # mined, then taken out by a reorganisation: unpaid unless submitted again, with the same root
                    detail = "a reorganisation removed its submission"
                    self.state.move_batch(batch.root, "listed", detail=detail, files="uploaded")
                    log.warning("batch 0x%s: %s %s; submitting it again", batch.root.hex()[:12], detail, batch.tx or "")
            if claimable and await self._voided():  # ejected by an invalidation: its pending work is void on chain
                for batch in claimable:
                    self.state.move_batch(batch.root, "void", detail=void_detail(pool_id), files="expired")
                claimable = []
            if claimable and self.settings.claim:
                roots, slots = [b.root for b in claimable], [_slot(b) for b in claimable]
                tx = await asyncio.to_thread(chain.claim_batches, pool_id, self.node, roots, slots=slots)
                for root in roots:  # their slots are free from now on
                    self.state.move_batch(root, "claimed", tx=tx, detail=f"claimed in {tx}", files="claimed")
                log.info("claimed the rewards of %d batches in %s", len(claimable), tx)
        self._update_stage_gauge()

    def _submission_gone(self, batch: BatchEntry) -> bool:
        """Whether the chain no longer holds `batch`'s submission transaction (blocking)."""
        if batch.tx is None:
            return True  # found on chain after a restart, and now not: only a reorganisation does that
        return self.chain.submission_gone(batch.tx)

    async def _note_invalidation(self, batch: BatchEntry) -> None:
        """Journals an invalidated batch and every file of it invalidated: the bad leaf with the validator's reason
        and the slash, the others voided by it."""
        event = await asyncio.to_thread(self.chain.batch_invalidation, self.pool_id, self.node, batch.root)
        keys = [record.work_key for record in self.state.members(batch.root)]
        voided = invalidation_details(batch.root, keys, event, self.chain.decimals)
        self.state.move_batch(batch.root, "invalidated", detail=voided.batch, files="invalidated",
                              leaf_details=voided.files)  # fmt: skip
        log.warning("batch 0x%s of %d files was invalidated: %s", batch.root.hex()[:12], batch.count, voided.batch)

    async def _note_refusals(self, batch: BatchEntry, record: BatchRecord) -> None:
        """Journals the leaves validators refused (not paid, not slashed) as refused; asks the chain leaf by leaf
        only while the refused units on chain exceed what the journal already holds refused."""
        members = self.state.members(batch.root)
        known = sum(r.units for r in members if r.stage == "refused")
        if record.refused_units <= known:
            return
        for member in members:
            if member.stage == "refused" or member.leaf_index is None:
                continue
            refused = await asyncio.to_thread(
                self.chain.is_leaf_refused, self.pool_id, self.node, batch.root, member.leaf_index
            )
            if refused:
                self.state.move([member.work_key], "refused", detail=REFUSED_DETAIL)
                log.warning("0x%s (leaf %d of batch 0x%s) was refused by a validator: not paid, not slashed",
                            member.work_key.hex()[:12], member.leaf_index, batch.root.hex()[:12])  # fmt: skip

    async def _check_availability(self, batch: BatchEntry) -> None:
        """While a batch's window is open: its leaf list and each file no validator has judged yet are uploaded
        again if the coordinator lost them (they would be invalidated as unavailable, reason 8, slashing this
        node), and what validators attested is journaled."""
        if self._coordinator is None:
            return
        waiting = [r for r in self.state.members(batch.root) if r.stage == "submitted" and r.verdict is None]
        for record in waiting:
            await self._restore_if_lost(record.work_key)
        try:
            await self._restore_list(self._coordinator, batch)
        except (CoordinatorError, OSError) as exc:
            log.warning("batch 0x%s: could not check or restore its leaf list with the coordinator: %s",
                        batch.root.hex()[:12], exc)  # fmt: skip
        for record in waiting:
            await self._note_verdict(record.work_key)

    async def _restore_if_lost(self, work_key: bytes) -> None:
        """Uploads a submitted file again when the coordinator no longer serves it and no validator has judged it:
        a file the coordinator lost would otherwise be invalidated as unavailable (reason 8) and slash this node."""
        if self._coordinator is None:
            return
        try:
            if await self._coordinator.holds(work_key):
                return
            await self._upload(self._coordinator, work_key, again=True)
        except (CoordinatorRefused, CoordinatorUnavailable, OSError) as exc:
            log.warning("0x%s is gone from the coordinator and could not be uploaded again: %s", work_key.hex()[:12],
                        exc)  # fmt: skip
            return
        self._restored.inc()
        log.warning("0x%s was gone from the coordinator before any validator judged it; uploaded it again",
                    work_key.hex()[:12])  # fmt: skip

    async def _note_verdict(self, work_key: bytes) -> None:
        """Journals what the validators attested on a file still in its window ("accepted" before it is claimable)."""
        if self._coordinator is None:
            return
        from ledger.types import Reason

        try:
            verdicts = await self._coordinator.attestations(work_key, self.pool_id)
        except (CoordinatorRefused, CoordinatorUnavailable) as exc:
            log.debug("no attestations for 0x%s yet: %s", work_key.hex()[:12], exc)
            return
        if not verdicts:
            return
        accepted = [v.validator for v in verdicts if v.accepted]
        rejected = [f"{v.validator} ({Reason.label(v.reason)})" for v in verdicts if not v.accepted]
        text = "; ".join(
            ([f"accepted by {', '.join(accepted)}"] if accepted else [])
            + ([f"rejected by {', '.join(rejected)}"] if rejected else [])
        )
        self.state.note_verdict(work_key, text)

    async def _ejected(self) -> bool:
        try:
            return await asyncio.to_thread(self.chain.is_ejected, self.pool_id, self.node)
        except Exception:  # the chain cannot be asked either: not known to be ejected
            return False

    async def _voided(self) -> bool:
        try:
            return await asyncio.to_thread(self.chain.is_voided, self.pool_id, self.node)
        except Exception:  # the chain cannot be asked either: not known to be void
            return False

    async def _explain_refusal(self, exc: CoordinatorRefused) -> None:
        if exc.code == "not_member" and await self._ejected():
            await self._explain_ejection()
        else:
            log.error("the coordinator refused: %s", exc)

    async def _explain_ejection(self) -> None:
        with contextlib.suppress(Exception):  # the reasons are a courtesy; the ejection is the news
            await self.follow_chain(force=True)
        log.error("ejected from pool %d: %s", self.pool_id, self._invalidations_summary())

    def _invalidations_summary(self) -> str:
        bad = self.state.batches_in_stage("invalidated")
        text = ", ".join(f"batch 0x{b.root.hex()[:12]} of {b.count} files: {b.detail}" for b in bad)
        return text or "no invalidation recorded yet"

    def _update_stage_gauge(self) -> None:
        for stage, count in self.state.counts().items():
            self._stage.set(count, stage=stage)
        for stage, count in self.state.batch_counts().items():
            self._batch_stage.set(count, stage=stage)

    # --- relay -------------------------------------------------------------------------------------

    async def _start_relay(self, policy: TrustPolicy) -> tuple[str, ShardServer, asyncio.Task[None]] | None:
        """With `relay_port`, mirrors the pool's checkpoint sources into the state folder and serves them on."""
        if self.settings.relay_port is None:
            return None
        from shardcast.mirror import Mirror
        from shardcast.server import ShardServer
        from shardcast.store import RELAY_MEMORY_MIB, ShardStore

        store = ShardStore(self.state_dir / "relay", memory_bytes=RELAY_MEMORY_MIB << 20)
        server = ShardServer(store, role="relay")
        mirror = Mirror(server, list(self.endpoints.checkpoints), policy=policy, keep=self.terms.async_level + 2)
        port = await server.start(self.settings.relay_host, self.settings.relay_port)
        url = f"http://{self.settings.relay_host}:{port}"
        log.info("relay on %s, mirroring %s", url, ", ".join(self.endpoints.checkpoints))
        return url, server, asyncio.create_task(mirror.run())

    async def _stop_relay(self, relay: tuple[str, ShardServer, asyncio.Task[None]]) -> None:
        _, server, task = relay
        await cancel_and_wait([task])
        await server.stop()

    # --- gossip ------------------------------------------------------------------------------------

    async def _start_gossip(
        self,
        domain: SigningDomain,
        trainer: str,
        weights: Weights,
        relay: tuple[str, ShardServer, asyncio.Task[None]] | None,
    ) -> WorkerGossip | None:
        """With `p2p_port`, a libp2p host that dialled the bootstrap peers and follows the pool's topics."""
        settings = self.settings
        if settings.p2p_port is None:
            return None
        from node.daemon.gossip import WorkerGossip  # libp2p takes a second or two to import
        from p2p import P2PConfig, P2PNode

        config = P2PConfig(listen_host=LOOPBACK, listen_port=settings.p2p_port)
        node = P2PNode(self.account, domain, config, registry=self.metrics)
        await node.start()
        relay_url, server = (relay[0], relay[1]) if relay is not None else (None, None)
        gossip = WorkerGossip(
            node,
            self.pool_id,
            trainer,
            weights,
            weights.sources,
            bootstrap=self.endpoints.bootstrap,
            relay_url=relay_url,
            bytes_served=(lambda: server.bytes_sent) if server is not None else None,
        )
        try:
            await gossip.start()
        except BaseException:
            await gossip.stop()
            raise
        return gossip

    # --- /metrics -----------------------------------------------------------------------------------

    async def _serve_metrics(self) -> web.AppRunner | None:
        """`/metrics`; the journal's gauge is refreshed at every iteration of the loop."""
        if self.settings.metrics_port is None:
            return None
        runner, url = await serve_metrics(self.metrics, LOOPBACK, self.settings.metrics_port)
        log.info("metrics at %s", url)
        return runner

    # --- dashboard ----------------------------------------------------------------------------------

    @property
    def held_step(self) -> int | None:
        """The policy step of the weights held; None before the first."""
        return self._held_step if self._held_step >= 0 else None

    @property
    def started_at(self) -> float:
        """When this process started, in unix seconds."""
        return self._started_at

    async def _serve_dashboard(self) -> web.AppRunner | None:
        """The operator's page (node/dashboard): the journal, the chain's word on each file, stake and tokens."""
        if self.settings.dashboard_port is None or self._dashboard is None:
            return None
        runner, url = await self._dashboard(self, LOOPBACK, self.settings.dashboard_port)
        log.info("dashboard on %s", url)
        return runner


def _slot(batch: BatchEntry) -> int:
    """The slot journaled with `batch`: every batch formed since slots has one (`WorkerState.form_batch`)."""
    if batch.slot is None:
        raise WorkerError(f"batch 0x{batch.root.hex()[:12]} has no slot in the journal: it was submitted before slots")
    return batch.slot


def check_assignment(
    job: Job, spec: TaskSpec, trainer: str, domain: SigningDomain, timing: AssignmentTiming, *, now: float
) -> None:
    """Raises WorkerError unless the pool's trainer signed exactly this job, with an issue time: a worker generates
    nothing else, since validators refuse (and slash) any other file. Raises UntimelyAssignment when that signed
    time is off `now` (this node's clock) by more than the pool's clock slack: a validator judges staleness by it."""
    if job.signature is None:
        raise WorkerError(f"the coordinator handed out counter {job.counter} unsigned; validators would refuse it")
    if job.issued_at is None:
        raise WorkerError(
            f"the coordinator handed out counter {job.counter} without an issue time: it signs assignments as "
            "before rollout format 3, and this node writes only files whose staleness validators can judge"
        )
    grant = Assignment(
        job.pool_id, job.node, job.step, job.counter, job.prompts, job.group_size, spec_hash(spec), job.issued_at
    )
    try:
        signer = recover(grant, job.signature, domain)
    except SignatureError as exc:
        raise WorkerError(f"the assignment of counter {job.counter} carries a malformed signature: {exc}") from exc
    if signer != trainer:
        raise WorkerError(
            f"the assignment of counter {job.counter} is signed by {signer}, not the pool's trainer {trainer}: "
            "the coordinator and this node disagree on the task or the pool"
        )
    if timing.off_clock(job.issued_at, now):
        raise UntimelyAssignment(
            f"counter {job.counter} at step {job.step} was issued at {job.issued_at} by the trainer's clock, "
            f"{job.issued_at - now:+.0f} s from this node's ({now:.0f}); the pool allows {timing.clock_slack} s either "
            "way. Check this machine's clock (NTP); if it is right, the coordinator's is off"
        )
