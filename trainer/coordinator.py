"""The coordinator's service (DESIGN section 8): assignments, uploads, verdicts and the pool's published steps.

Plain objects with no HTTP in them: `trainer/api.py` reads the bodies, checks the request signatures and calls
`CoordinatorService` with the signer, typed messages of `protocol.coordinator` in and out. A refusal is a `Refused`
carrying its `protocol.coordinator.ErrorCode`; the API answers it with the code's status.

An assignment is answered with the trainer's EIP-712 signature over `Assignment(poolId, node, step, counter,
prompts, groupSize, taskSpecHash, issuedAt)`, `issuedAt` being the trainer's clock when it signs: the worker writes
it into the file, and validators refuse a file whose work was not handed out in exactly that shape (one generation
re-sliced into many files, or a counter never issued), and judge its staleness by that signed time and the chain's
block time of its submission (protocol.terms.AssignmentTiming), never by `GET /v1/steps`.

Assignments are capped per node and policy step (`files_per_node_per_step`). A request over the cap is held until
the trainer publishes the next step (at most `hold_seconds`), then answered with that step's assignment, or with
503 `no_work` and Retry-After: the trainer uses only the files
of the last `async_level + 1` steps, so a fast node left unlimited would fill the chain, the validators' queue and
the pool's reward bill with files that go stale before anyone trains on them.

A node may also be limited by its uploads the trainer has not yet trained on (`pending_files_per_node`; local
mode sets it to the files of the k + 1 steps the window holds, as it takes the oldest files first): held the same
way, a worker then generates the next steps' files while the trainer trains on the last ones, and never more than
the trainer can use.

An upload is checked against its name (the body's sha256), then the signer's quota (below), then the file's format
and its node and pool, parsed in a child process with a memory limit and a timeout (`trainer/parsing.py`), never
on the event loop. A stored upload is answered with a `receipt`: the trainer's EIP-712 signature over
`UploadReceipt(poolId, workKey, node)`, which the worker keeps. A file acknowledged that way and lost afterwards
answers 410 `lost`, not 404: validators never slash for it.

Each member has a quota of what the coordinator stores for it (`max_stored_bytes_per_node`,
`max_stored_files_per_node`), so one member cannot fill the disk. A stored file counts against its uploader while
the trainer may still train on it: from its upload until the step current then has left the window (the trainer
has trained on it or dropped it as stale, `trainer/loop.py`); an upload in flight counts from its checks on. An
upload past the quota is refused with 429 `quota` and Retry-After before it is parsed or stored, and a worker
keeps the file to upload it later. The upload is reserved once the signature is checked, not before the body is
read: until then the signer is only claimed, and a reservation in a claimed name would let a stranger hold a
member's quota with slow uploads. A re-upload of a stored file stores nothing and is never refused for the quota.
A restarted coordinator counts the inbox again, each file under the step current when it was written (its
modification time against the published steps).

A batch's leaf list (`PUT /v1/batches/{root}`, `protocol.batches`) is what validators need to check a batch recorded
on chain as one Merkle root. It is stored (`trainer/batches.py`) only when its leaves hash to the root the path names
and every file it names is held here, and answered with the trainer's signature over `BatchReceipt(poolId, root,
node, count)` for the node that sent it, whoever sent it first; lost after that, it answers 410 `lost` as a file
does. A node's lists count against a quota of their own (`max_stored_batches_per_node`, by default as many as its
files), held and let go as its files are: a list is small (160 KiB at most), but a member could make endless
distinct ones from one file.

A validator's verdict is recorded once its signature recovers to the validator that signed the request, in the
`VerdictStore` (`trainer/verdicts.py`) that the step loop reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_utils import is_checksum_address

from core.config import ConfigError, Settings, held, setting
from core.serving import ConnectionLimits
from ledger.merkle import BatchTree, Leaf
from protocol.batches import MAX_BATCH_LEAVES, LeafListError, decode_leaves
from protocol.coordinator.errors import ErrorCode
from protocol.coordinator.pool import PoolInfo, PublishedStep, StepHistory, StepInfo, TaskGrant
from protocol.coordinator.rollouts import AttestationBody, AttestationList, AttestationRecord, BatchUpload, Upload
from protocol.signing import (
    DEFAULT_MAX_SKEW,
    Assignment,
    Attestation,
    BatchReceipt,
    SignatureError,
    SigningDomain,
    UploadReceipt,
    recover,
    sign,
)
from protocol.terms import (
    DEFAULT_ASYNC_LEVEL,
    DEFAULT_GROUP_SIZE,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_PROMPTS_PER_TASK,
    MAX_ASYNC_LEVEL,
    MAX_FILE_BYTES,
    MAX_GROUP_SIZE,
    MAX_PROMPTS_PER_TASK,
    MIN_FILE_BYTES,
    MIN_GROUP_SIZE,
    step_window,
)
from trainer.batches import BatchInbox
from trainer.errors import TrainerError
from trainer.in_flight import FilesInFlight
from trainer.inbox import Reservation, RolloutInbox, UploadQuota, UploadQuotaExceeded
from trainer.parsing import ParseConfig, UnparsedUpload, UploadParser
from trainer.roles import RoleLookupBusy, Roles
from trainer.verdicts import VerdictStore

STEP_HISTORY = 1024  # published steps `GET /v1/steps` remembers, newest last
INBOX_WRITERS = 4  # threads writing and fsyncing uploads: disks overlap several fsyncs
_PARSE_CODES = {ErrorCode.MALFORMED_FILE, ErrorCode.TOO_LARGE, ErrorCode.PARSE_TIMEOUT, ErrorCode.PARSER_DIED}


@dataclass(frozen=True)
class ApiConfig(Settings):
    """Limits of the coordinator API, each held to its declaration however the config is made. trainer.toml's
    [coordinator] table sets some of them (trainer.config.CoordinatorSettings, with these bounds), and derives the
    per-node limits from the pool's pace; the rest are the service's own."""

    max_upload_bytes: int = setting(
        "larger uploads are refused unread (the pool's file-size limit, protocol.terms)",
        default=DEFAULT_MAX_FILE_BYTES,
        minimum=MIN_FILE_BYTES,
        maximum=MAX_FILE_BYTES,
    )
    max_json_bytes: int = setting("largest JSON body of a request", default=64 * 1024, minimum=1)
    max_skew: float = setting(
        "seconds a signed request's timestamp may be off (DESIGN section 5)", default=float(DEFAULT_MAX_SKEW), minimum=1
    )
    prompts_per_task: int = setting(
        "problems per assigned file (the pool's term)",
        default=DEFAULT_PROMPTS_PER_TASK,
        minimum=1,
        maximum=MAX_PROMPTS_PER_TASK,
    )
    group_size: int = setting(
        "completions per problem, a GRPO group (the pool's term)",
        default=DEFAULT_GROUP_SIZE,
        minimum=MIN_GROUP_SIZE,
        maximum=MAX_GROUP_SIZE,
    )
    files_per_node_per_step: int = setting(
        "assignments one node gets at one policy step; 0: no limit", default=0, minimum=0
    )
    pending_files_per_node: int = setting(
        "uploads of one node not yet trained on, past which it waits; 0: no limit", default=0, minimum=0
    )
    max_files_in_flight: int = setting(
        "the pool's assignments that may still be trained on (trainer.in_flight); 0: no limit", default=0, minimum=0
    )
    hold_seconds: float = setting(
        "a node over its limit waits this long for the next step before a 503", default=10.0, minimum=0
    )
    # signed requests per second per client address and per signer (token buckets of the bursts); 429 above them
    requests_per_address_per_s: float = setting("signed requests a second per address", default=200.0, above=0)
    address_burst: int = setting("burst of signed requests per address", default=1000, minimum=1)
    requests_per_signer_per_s: float = setting("signed requests a second per signer", default=50.0, above=0)
    signer_burst: int = setting("burst of signed requests per signer", default=200, minimum=1)
    retry_after: float = setting("seconds a node still over its limit is told to wait", default=1.0, above=0)
    # what the coordinator stores for one node that the trainer may still train on; past either an upload gets 429
    max_stored_bytes_per_node: int = setting(
        "bytes of one node's stored uploads the trainer may still train on; 0: no limit", default=0, minimum=0
    )
    max_stored_files_per_node: int = setting(
        "files of one node stored that the trainer may still train on; 0: no limit", default=0, minimum=0
    )
    max_stored_batches_per_node: int = setting(
        "leaf lists of one node stored within the window; 0: as many as max_stored_files_per_node", default=0, minimum=0
    )
    async_level: int = setting(
        "the pool's window k (protocol.terms): a file stops counting k + 1 steps after the step it came at",
        default=DEFAULT_ASYNC_LEVEL,
        minimum=0,
        maximum=MAX_ASYNC_LEVEL,
    )
    parsing: ParseConfig = held("the processes that parse uploads, off the event loop", default_factory=ParseConfig)
    connections: ConnectionLimits = held(
        "the server's connections, header and body timeouts (core.serving)", default_factory=ConnectionLimits
    )
    # the bodies read before their signature is checked (from clients that do not declare X-Prime-Body-Sha256), at
    # once per address and in all; 429 above
    unsigned_bodies_per_address: int = setting("unsigned bodies read at once per address", default=2, minimum=1)
    unsigned_bodies: int = setting("unsigned bodies read at once in all", default=32, minimum=1)
    max_nonces: int = setting(
        "signed requests' nonces held at once, all signers together (protocol.signing.NonceCache)",
        default=100_000,
        minimum=1,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if 0 < self.max_stored_bytes_per_node < self.max_upload_bytes:
            raise ConfigError(
                f"max_stored_bytes_per_node ({self.max_stored_bytes_per_node}) must be 0 or at least max_upload_bytes "
                f"({self.max_upload_bytes}): a node could never store a file of the largest size",
                where="max_stored_bytes_per_node",
            )


@dataclass
class PoolState:
    """What the trainer publishes about itself; `step` moves as training goes (through `publish`)."""

    pool_id: int
    trainer: str
    step: int = 0
    counters: dict[str, int] = field(default_factory=dict)  # next assignment counter per node
    history: deque[PublishedStep] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))

    _next_step: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.history = deque(self.history, maxlen=STEP_HISTORY)

    def remember(self, published: Iterable[PublishedStep]) -> None:
        """Loads earlier publications (a restarted trainer's record), oldest first."""
        for entry in published:
            if not self.history or entry.step > self.history[-1].step:
                self.history.append(entry)

    def publish(self, step: int, at: float) -> PublishedStep | None:
        """`step` is current from `at` on; returns the new record, or None for a step published before (a restart).

        Call it on the event loop's thread: it wakes the requests waiting in `wait_past`."""
        if step != self.step:
            self.step = step
            self._next_step.set()
            self._next_step = asyncio.Event()
        if self.history and self.history[-1].step >= step:
            return None
        entry = PublishedStep(step, round(at, 3))
        self.history.append(entry)
        return entry

    async def wait_past(self, step: int, timeout: float) -> None:
        """Returns once the current step is not `step`, or after `timeout` seconds."""
        if self.step == step:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._next_step.wait(), timeout)


def step_at(history: Sequence[PublishedStep], at: float, current: int) -> int:
    """The step current at `at` (unix seconds) by `history` (oldest first): before its first entry, the step before
    that one; with no history, `current`. With 50 ms of slack, towards the later step: a step's time is rounded to
    the millisecond, and a file's modification time comes from a coarser clock."""
    if not history:
        return current
    i = bisect_right([entry.at for entry in history], at + 0.05)
    return history[i - 1].step if i else history[0].step - 1


class Refused(TrainerError):
    """The coordinator refuses a request: `code` says why (the API answers with its status), `retry_after` says
    when to ask again (None: not worth it)."""

    def __init__(self, code: ErrorCode, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after


class CoordinatorService:
    """The coordinator's logic over the pool's state, the inbox, the quota and the verdicts; no HTTP here."""

    def __init__(
        self,
        *,
        domain: SigningDomain,
        state: PoolState,
        roles: Roles,
        inbox: RolloutInbox,
        verdicts: VerdictStore,
        batches: BatchInbox | None = None,
        config: ApiConfig | None = None,
        on_upload: Callable[[bytes, str], Awaitable[None]] | None = None,
        on_assign: Callable[[str, int], Awaitable[None] | None] | None = None,
        on_attest: Callable[[bytes], None] | None = None,
        pending: Callable[[str], int] | None = None,
        signer: LocalAccount | None = None,
        task_spec_hash: bytes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.domain, self.state, self.roles, self.inbox, self.verdicts = domain, state, roles, inbox, verdicts
        # batches' leaf lists, beside the files they name unless given
        self.batches = BatchInbox(inbox.root / "batches") if batches is None else batches
        self.signer = signer  # the trainer's key: signs upload receipts and assignments (None: neither is signed)
        self.task_spec_hash = task_spec_hash  # the pool's task, which every signed assignment names
        self.clock = clock  # the trainer's clock, which stamps each signed assignment's issue time
        self.config = config or ApiConfig()
        self.on_upload = on_upload
        # (node, counter handed out): lets the trainer persist counters before answering; an awaitable it returns is
        # awaited first (trainer/counters.py makes a batch of them durable with one fsync, off the event loop)
        self.on_assign = on_assign
        self.on_attest = on_attest  # (work key) after a verdict is recorded: a file may have become trainable
        self.pending = pending  # (node) its uploads the trainer has not trained on or dropped; None: not counted
        self._handed: dict[str, tuple[int, int]] = {}  # node -> (step, assignments at that step)
        self.in_flight = FilesInFlight(self.config.async_level)  # the pool's, against max_files_in_flight
        self._storing: dict[tuple[Path, bytes], asyncio.Future[bool]] = {}  # (folder, key) -> its write in a thread
        self.quota = UploadQuota(self.config.max_stored_bytes_per_node, self.config.max_stored_files_per_node)
        max_batches = self.config.max_stored_batches_per_node or self.config.max_stored_files_per_node
        self.batch_quota = UploadQuota(0, max_batches)  # lists, not bytes: each is 160 KiB at most
        self._count_stored()
        self.parser = UploadParser(self.config.parsing)  # its processes start with the first upload
        # inbox writes have threads of their own: in the default pool they queued behind role lookups (web3 calls)
        # and the step loop's work, and every upload waited for them
        self._writers = ThreadPoolExecutor(INBOX_WRITERS, thread_name_prefix="inbox")

    async def close(self) -> None:
        await self.parser.close()
        await asyncio.to_thread(self._writers.shutdown, True)  # a write under way ends: no key is left half-stored

    # --- who may ask ---------------------------------------------------------------------------------

    async def authorize(self, signer: str, role: str) -> None:
        """Refuses `signer` unless it holds `role` ("member" or "validator") in the pool (one chain lookup per
        unknown address, within a budget)."""
        try:
            allowed = await (self.roles.is_member if role == "member" else self.roles.is_validator)(signer)
        except RoleLookupBusy as exc:
            raise Refused(ErrorCode.BUSY, str(exc), retry_after=exc.retry_after) from None
        if not allowed:
            code, what = (
                (ErrorCode.NOT_MEMBER, "a member") if role == "member" else (ErrorCode.NOT_VALIDATOR, "a validator")
            )
            raise Refused(code, f"{signer} is not {what} of pool {self.state.pool_id}")

    # --- the pool's state ----------------------------------------------------------------------------

    def pool(self) -> PoolInfo:
        return PoolInfo(self.state.pool_id, self.state.trainer, self.state.step)

    def step(self) -> StepInfo:
        return StepInfo(self.state.step)

    def steps(self) -> StepHistory:
        return StepHistory(tuple(self.state.history))

    # --- assignments ---------------------------------------------------------------------------------

    async def assign(self, node: str) -> TaskGrant:
        """The next assignment of member `node`; held until the next step while it is over its limits."""
        step, handed = self._handed_now(node)
        if self._over_limit(node, step, handed):  # held until the trainer publishes the next step: answered as it does
            await self.state.wait_past(step, self.config.hold_seconds)
            step, handed = self._handed_now(node)
        if reason := self._over_limit(node, step, handed):
            raise Refused(ErrorCode.NO_WORK, reason, retry_after=self.config.retry_after)
        self._handed[node] = (step, handed + 1)
        counter = self.state.counters.get(node, 0)
        self.state.counters[node] = counter + 1
        self.in_flight.issued(node, counter, step)
        if self.on_assign is not None and (persisted := self.on_assign(node, counter)) is not None:
            await persisted  # counted above, before this await: a request racing this one gets the next counter
        prompts, group_size = self.config.prompts_per_task, self.config.group_size
        grant = TaskGrant(self.state.pool_id, node, step, counter, prompts, group_size)
        if self.signer is None or self.task_spec_hash is None:
            return grant
        issued_at = int(self.clock())  # after any hold: the time the grant leaves, which the worker checks
        signed = Assignment(
            self.state.pool_id, node, step, counter, prompts, group_size, self.task_spec_hash, issued_at
        )
        signature = sign(signed, self.signer, self.domain)
        return TaskGrant(
            self.state.pool_id, node, step, counter, prompts, group_size, self.task_spec_hash, signature, issued_at
        )

    def _over_limit(self, node: str, step: int, handed: int) -> str:
        """Why `node` gets no assignment now ("" when it does)."""
        limit = self.config.files_per_node_per_step
        if limit and handed >= limit:
            return f"{node} has its {limit} assignments of step {step}; more when the trainer publishes step {step + 1}"
        limit = self.config.pending_files_per_node
        if limit and self.pending is not None and (waiting := self.pending(node)) >= limit:
            return f"{node} has {waiting} uploads the trainer has not trained on yet; more once it trains on them"
        limit = self.config.max_files_in_flight
        if limit and (flying := self.in_flight.count(step)) >= limit:
            return (
                f"the pool has {flying} files in flight, what its window of {self.config.async_level + 1} steps trains "
                f"on; more when the trainer takes some"
            )
        return ""

    def _handed_now(self, node: str) -> tuple[int, int]:
        """The current step, and the assignments `node` got at it."""
        step = self.state.step
        at_step, handed = self._handed.get(node, (step, 0))
        return step, handed if at_step == step else 0

    # --- the stored-upload quota ---------------------------------------------------------------------

    def _oldest_step(self) -> int:
        """The oldest step whose uploads the trainer may still train on: files stored before it no longer count."""
        return step_window(self.state.step, self.config.async_level).oldest

    def _count_stored(self) -> None:
        """What the inbox holds that still counts (a restart), each file under the step current when it was
        written. Files written before the oldest step of the window was published are not opened."""
        oldest, history = self._oldest_step(), list(self.state.history)
        since = next((entry.at for entry in history if entry.step >= oldest), 0.0)
        for quota, stored_since in ((self.quota, self.inbox.stored), (self.batch_quota, self.batches.stored)):
            for stored in stored_since(since):
                quota.hold(stored.node, stored.size, step_at(history, stored.stored_at, self.state.step))

    def check_quota(self, work_key: bytes, node: str, size: int) -> None:
        """Refuses (429 quota) an upload of `size` bytes that `node`'s quota could not hold now, before its body is
        read; `upload` reserves the bytes it read."""
        if not self.inbox.has(work_key):
            self._reserve(node, size).close()

    def _reserve(self, node: str, size: int, quota: UploadQuota | None = None) -> Reservation:
        try:
            return (self.quota if quota is None else quota).reserve(node, size, self._oldest_step())
        except UploadQuotaExceeded as exc:
            raise Refused(ErrorCode.QUOTA, str(exc), retry_after=self.config.retry_after) from None

    # --- uploads and downloads -----------------------------------------------------------------------

    async def upload(self, work_key: bytes, body: bytes, node: str) -> Upload:
        """Stores member `node`'s file under `work_key`, which must be its sha256; `created` False: held already."""
        actual = hashlib.sha256(body).digest()
        if actual != work_key:
            raise Refused(ErrorCode.HASH_MISMATCH, f"the body's sha256 is {actual.hex()}, not {work_key.hex()}")
        if self.inbox.has(work_key):  # stores nothing: never refused for the quota
            return Upload(work_key, False, self._receipt(work_key, node))
        reservation = self._reserve(node, len(body))  # the bytes read, whatever was declared; before any await
        try:
            try:  # in a child process: the event loop keeps answering, and no file can take this process down
                meta = await self.parser.parse(body, self.config.max_upload_bytes)
            except UnparsedUpload as exc:  # malformed_file, too_large (its memory limit), parse_timeout, parser_died
                code = ErrorCode(exc.code) if exc.code in _PARSE_CODES else ErrorCode.PARSER_DIED
                raise Refused(code, exc.message) from None
            if meta.node != node:
                raise Refused(ErrorCode.WRONG_NODE, f"the file is for node {meta.node}; {node} signed the upload")
            if meta.pool_id != self.state.pool_id:
                raise Refused(ErrorCode.WRONG_POOL, f"the file is for pool {meta.pool_id}, not {self.state.pool_id}")
            created = await self._store(self.inbox, work_key, body, node)
            if created:
                reservation.keep(self.state.step)
                self.in_flight.uploaded(work_key, node, meta.counter)
        finally:
            reservation.close()  # not stored (refused, a failed write, or the same bytes stored meanwhile)
        if created and self.on_upload is not None:
            await self.on_upload(work_key, node)
        return Upload(work_key, created, self._receipt(work_key, node))

    async def _store(self, store: RolloutInbox | BatchInbox, key: bytes, body: bytes, node: str) -> bool:
        """`store.put` in one of the coordinator's writer threads: its write and fsync held the event loop (every
        request) for as long as the disk took. One write a key at a time: an upload of bytes being written waits for
        that write, then stores nothing unless it failed. The write is shielded: aiohttp does not cancel a handler
        whose client went away, so only a shutdown cancels this, and the write still ends and lets go of its key."""
        slot = (store.root, key)
        while (writing := self._storing.get(slot)) is not None:
            with contextlib.suppress(Exception):  # the first writer answers its own failure
                await asyncio.shield(writing)
        if store.has(key):  # stored while this upload waited for that write, or while it was being parsed
            return False
        write = asyncio.get_running_loop().run_in_executor(self._writers, store.put, key, body, node)
        task = asyncio.ensure_future(write)
        self._storing[slot] = task
        task.add_done_callback(lambda _: self._storing.pop(slot, None))
        return await asyncio.shield(task)

    def _receipt(self, work_key: bytes, node: str) -> bytes | None:
        """The trainer-signed `UploadReceipt` for the node that stored the file (None without a signing key, or for
        another node re-sending bytes someone else uploaded first)."""
        if self.signer is None or self.inbox.uploader(work_key) != node:
            return None
        return sign(UploadReceipt(self.state.pool_id, work_key, node), self.signer, self.domain)

    def stored_file(self, work_key: bytes) -> Path:
        """Where the stored file `work_key` is, to be served."""
        if self.inbox.lost(work_key):  # acknowledged, then lost here: no worker may be slashed for it
            raise Refused(ErrorCode.LOST, f"rollout file {work_key.hex()} was stored and acknowledged, and is gone")
        if not self.inbox.has(work_key):
            raise Refused(ErrorCode.NOT_FOUND, f"no rollout file {work_key.hex()}")
        return self.inbox.path(work_key)

    # --- batches' leaf lists -------------------------------------------------------------------------

    def check_batch_quota(self, root: bytes, node: str) -> None:
        """Refuses (429 quota) a leaf list that `node`'s quota could not hold now, before its body is read."""
        if not self.batches.has(root):
            self._reserve(node, 0, self.batch_quota).close()

    async def upload_batch(self, root: bytes, body: bytes, node: str) -> BatchUpload:
        """Stores member `node`'s leaf list under `root`, which its leaves must hash to, once every file it names is
        held; `created` False: held already (and receipted for `node` too)."""
        # off the event loop: a list of 4,096 leaves is 8,191 hashes and as many stats, some 75 ms
        check = asyncio.get_running_loop().run_in_executor(self._writers, check_leaf_list, root, body, self.inbox.has)
        leaves, missing = await check
        if self.batches.has(root):  # stores nothing: never refused for the quota or for files lost since
            return BatchUpload(root, len(leaves), False, self._batch_receipt(root, node, len(leaves)))
        if missing:
            first = missing[0]
            message = (
                f"leaf {first} names rollout file {leaves[first].work_key.hex()}, which the coordinator does not hold "
                f"({len(missing)} of the {len(leaves)} leaves name such files); upload the files first"
            )
            raise Refused(ErrorCode.MISSING_FILES, message)
        reservation = self._reserve(node, 0, self.batch_quota)  # before any await
        try:
            created = await self._store(self.batches, root, body, node)
            if created:
                reservation.keep(self.state.step)
        finally:
            reservation.close()  # not stored (a failed write, or the same list stored meanwhile)
        return BatchUpload(root, len(leaves), created, self._batch_receipt(root, node, len(leaves)))

    def _batch_receipt(self, root: bytes, node: str, count: int) -> bytes | None:
        """The trainer-signed `BatchReceipt` for `node`, which sent the list (None without a signing key)."""
        if self.signer is None:
            return None
        return sign(BatchReceipt(self.state.pool_id, root, node, count), self.signer, self.domain)

    def stored_batch(self, root: bytes) -> Path:
        """Where the stored leaf list `root` is, to be served."""
        if self.batches.lost(root):  # acknowledged, then lost here: no worker may be slashed for it
            raise Refused(ErrorCode.LOST, f"leaf list {root.hex()} was stored and acknowledged, and is gone")
        if not self.batches.has(root):
            raise Refused(ErrorCode.NOT_FOUND, f"no leaf list {root.hex()}")
        return self.batches.path(root)

    # --- verdicts ------------------------------------------------------------------------------------

    def attest(self, signer: str, body: AttestationBody) -> None:
        """Records validator `signer`'s verdict, once its signature recovers to `signer`."""
        attestation = Attestation(self.state.pool_id, body.work_key, body.accepted, body.reason)
        try:
            attester = recover(attestation, body.signature, self.domain)
        except SignatureError as exc:
            raise Refused(ErrorCode.BAD_ATTESTATION, f"not a signed attestation: {exc}") from None
        if attester != signer or not is_checksum_address(attester):
            message = f"the attestation is signed by {attester}, the request by {signer}"
            raise Refused(ErrorCode.BAD_ATTESTATION, message)
        self.verdicts.record(AttestationRecord(body.work_key, body.accepted, body.reason, signer, body.signature))
        if not body.accepted:  # a rejection vetoes the file for good (trainer.verdicts)
            self.in_flight.vetoed(body.work_key)
        if self.on_attest is not None:
            self.on_attest(body.work_key)

    def attestations(self, work_key: bytes) -> AttestationList:
        """Each validator's latest verdict on a stored file."""
        if not self.inbox.has(work_key):
            raise Refused(ErrorCode.NOT_FOUND, f"no rollout file {work_key.hex()}")
        return AttestationList(work_key, tuple(self.verdicts.latest(work_key)))


def check_leaf_list(root: bytes, body: bytes, held: Callable[[bytes], bool]) -> tuple[tuple[Leaf, ...], list[int]]:
    """The leaves of an uploaded list whose Merkle root must be `root`, and the indices of those naming a file not
    `held`, in order; `Refused` for a list that does not decode (400 `malformed_batch`) or hashes to another root
    (400 `root_mismatch`)."""
    try:
        leaves = decode_leaves(body, max_leaves=MAX_BATCH_LEAVES)
    except LeafListError as exc:
        raise Refused(ErrorCode.MALFORMED_BATCH, f"not a leaf list: {exc}") from None
    actual = BatchTree(leaves).root
    if actual != root:
        message = f"the leaves' Merkle root is {actual.hex()}, not the {root.hex()} the path names"
        raise Refused(ErrorCode.ROOT_MISMATCH, message)
    answers: dict[bytes, bool] = {}
    for leaf in leaves:  # each file looked up once, however many leaves name it
        if leaf.work_key not in answers:
            answers[leaf.work_key] = held(leaf.work_key)
    return leaves, [index for index, leaf in enumerate(leaves) if not answers[leaf.work_key]]
