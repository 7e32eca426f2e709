"""The coordinator API the trainer serves (DESIGN section 8), on aiohttp.

| route | who | what |
|---|---|---|
| `GET /v1/pool`, `GET /v1/step` | anyone | the pool's id, trainer and current policy step |
| `GET /v1/steps` | anyone | when each recent step became current (validators judge staleness at submission time) |
| `POST /v1/tasks` | signed, a pool member | the next assignment for the signing node (503 `no_work`: see below) |
| `PUT /v1/rollouts/{sha256}` | signed, a member | upload a rollout file; content-addressed, idempotent, receipted |
| `GET /v1/rollouts/{sha256}` | anyone | download an uploaded file (validators); 410 `lost`: stored, then lost |
| `GET /v1/rollouts/{sha256}/attestations` | anyone | the signed verdicts validators posted on that file |
| `POST /v1/attestations` | signed, a validator | a signed verdict on a work key |
| `GET /metrics` | anyone | Prometheus text |

Every signed request carries the EIP-712 `Request` headers (DESIGN section 5). The order of checks on an upload
is cheapest first: the declared size, the bounded body read, the signature (timestamp, signer, nonce), the
signer's role, the body's sha256 against the name, the signer's quota (below), then the file's format and its node
and pool, parsed in a child process with a memory limit and a timeout (`trainer/parsing.py`), never on the event
loop. Each refusal is a 4xx JSON body `{"error": code, "message": text}` with its own code. A stored upload is
answered with a `receipt`: the trainer's EIP-712 signature over `UploadReceipt(poolId, workKey, node)`, which the
worker keeps. A file acknowledged that way and lost afterwards answers 410 `lost`, not 404: validators never slash
for it.

An assignment is answered with the trainer's EIP-712 signature over `Assignment(poolId, node, step, counter,
prompts, groupSize, taskSpecHash)`: the worker writes it into the file, and validators refuse a file whose work
was not handed out in exactly that shape (one generation re-sliced into many files, or a counter never issued).

Assignments are capped per node and policy step (`files_per_node_per_step`). A request over the cap is held until
the trainer publishes the next step (at most `hold_seconds`), then answered with that step's assignment, or with
503 `no_work` and Retry-After: the trainer uses only the files
of the last `async_level + 1` steps, so a fast node left unlimited would fill the chain, the validators' queue and
the pool's reward bill with files that go stale before anyone trains on them.

A node may also be limited by its uploads the trainer has not yet trained on (`pending_files_per_node`; local
mode sets it to the files of the k + 1 steps the window holds, as it takes the oldest files first): held the same
way, a worker then generates the next steps' files while the trainer trains on the last ones, and never more than
the trainer can use.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from eth_account.signers.local import LocalAccount
from eth_utils import is_checksum_address

from node.bodies import read_body
from node.coordinator import PublishedStep
from node.metrics import Registry
from node.ratelimit import RateLimiter
from node.safejson import loads_bounded
from node.signing import (
    Assignment,
    Attestation,
    AuthFailure,
    NonceCache,
    RequestAuthError,
    SignatureError,
    SigningDomain,
    UploadReceipt,
    check_request,
    recover,
    sign,
)
from trainer.inbox import Reservation, RolloutInbox, UploadQuota, UploadQuotaExceeded
from trainer.parsing import ParseConfig, UnparsedUpload, UploadParser
from trainer.roles import RoleLookupBusy, Roles

_SHA256 = re.compile(r"[0-9a-f]{64}")
STEP_HISTORY = 1024  # published steps `GET /v1/steps` remembers, newest last
_AUTH_STATUS = {
    AuthFailure.MISSING_HEADER: 401,
    AuthFailure.MALFORMED_HEADER: 400,
    AuthFailure.TIMESTAMP_SKEW: 401,
    AuthFailure.BAD_SIGNATURE: 401,
    AuthFailure.SIGNER_MISMATCH: 401,
    AuthFailure.REPLAYED_NONCE: 409,
    AuthFailure.NONCE_CACHE_FULL: 503,
}


@dataclass(frozen=True)
class ApiConfig:
    """Limits of the coordinator API."""

    max_upload_bytes: int = 64 * 1024 * 1024  # the pool's file-size limit
    max_json_bytes: int = 64 * 1024
    max_skew: float = 300.0  # seconds a signed request's timestamp may be off (DESIGN section 5)
    prompts_per_task: int = 8
    group_size: int = 8
    files_per_node_per_step: int = 0  # assignments one node gets at one policy step; 0 = no limit
    pending_files_per_node: int = 0  # uploads of one node not yet trained on, past which it waits; 0 = no limit
    hold_seconds: float = 10.0  # a node over its limit waits this long for the next step before a 503
    # signed requests per second per client address and per signer (token buckets of the bursts); 429 above them
    requests_per_address_per_s: float = 200.0
    address_burst: int = 1000
    requests_per_signer_per_s: float = 50.0
    signer_burst: int = 200
    retry_after: float = 1.0  # seconds a node still over its limit is told to wait
    # what the coordinator stores for one node that the trainer may still train on; 0 = no limit (trainer.config
    # derives both from the pool's pace); past either an upload gets 429 quota
    max_stored_bytes_per_node: int = 0
    max_stored_files_per_node: int = 0
    async_level: int = 1  # the trainer's window k: a file stops counting k + 1 steps after the step it came at
    parsing: ParseConfig = field(default_factory=ParseConfig)  # the processes that parse uploads, off the event loop

    def __post_init__(self) -> None:
        if self.max_upload_bytes < 1 or self.max_json_bytes < 1 or self.max_skew <= 0:
            raise ValueError("upload and JSON limits and max_skew must be positive")
        if self.prompts_per_task < 1 or self.group_size < 1:
            raise ValueError("prompts_per_task and group_size must be at least 1")
        limits = (self.files_per_node_per_step, self.pending_files_per_node, self.hold_seconds)
        if min(self.requests_per_address_per_s, self.requests_per_signer_per_s) <= 0:
            raise ValueError("the request rates must be positive")
        if min(self.address_burst, self.signer_burst) < 1:
            raise ValueError("the request bursts must be at least 1")
        if min(limits) < 0 or self.retry_after <= 0:
            raise ValueError("the per-node limits and hold_seconds must be at least 0, retry_after positive")
        if min(self.max_stored_bytes_per_node, self.max_stored_files_per_node, self.async_level) < 0:
            raise ValueError("the stored-upload quota and async_level must be at least 0")
        if 0 < self.max_stored_bytes_per_node < self.max_upload_bytes:
            raise ValueError(
                f"max_stored_bytes_per_node ({self.max_stored_bytes_per_node}) must be 0 or at least max_upload_bytes "
                f"({self.max_upload_bytes}): a node could never store a file of the largest size"
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


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after


@dataclass(frozen=True)
class LoggedVerdict:
    """One line of the attestations log: a validator's verdict on a work key, and the record as the API wrote it."""

    work_key: bytes
    validator: str
    accepted: bool
    record: dict[str, object]


def parse_logged_verdict(line: bytes) -> LoggedVerdict | None:
    """A line of the attestations log, or None for one cut short by a crash (its validator posts again)."""
    try:
        record = loads_bounded(line, 1)
        key = bytes.fromhex(str(record["work_key"]).removeprefix("0x"))
        return LoggedVerdict(key, str(record["validator"]), record["accepted"] is True, record)
    except (ValueError, KeyError, TypeError):
        return None


def _load_verdicts(path: Path) -> dict[bytes, dict[str, dict[str, object]]]:
    """The attestations log, indexed by work key and validator (each validator's latest record)."""
    verdicts: dict[bytes, dict[str, dict[str, object]]] = {}
    if not path.exists():
        return verdicts
    for line in path.read_bytes().splitlines():
        if (verdict := parse_logged_verdict(line)) is not None:
            verdicts.setdefault(verdict.work_key, {})[verdict.validator] = verdict.record
    return verdicts


def step_at(history: Sequence[PublishedStep], at: float, current: int) -> int:
    """The step current at `at` (unix seconds) by `history` (oldest first): before its first entry, the step before
    that one; with no history, `current`. With 50 ms of slack, towards the later step: a step's time is rounded to
    the millisecond, and a file's modification time comes from a coarser clock."""
    if not history:
        return current
    i = bisect_right([entry.at for entry in history], at + 0.05)
    return history[i - 1].step if i else history[0].step - 1


def _json_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status)


class CoordinatorApi:
    def __init__(
        self,
        *,
        domain: SigningDomain,
        state: PoolState,
        roles: Roles,
        inbox: RolloutInbox,
        attestations: Path,
        config: ApiConfig | None = None,
        on_upload: Callable[[bytes, str], Awaitable[None]] | None = None,
        on_assign: Callable[[str, int], None] | None = None,
        on_attest: Callable[[bytes], None] | None = None,
        pending: Callable[[str], int] | None = None,
        signer: LocalAccount | None = None,
        task_spec_hash: bytes | None = None,
    ) -> None:
        self.domain, self.state, self.roles, self.inbox = domain, state, roles, inbox
        self.signer = signer  # the trainer's key: signs upload receipts and assignments (None: neither is signed)
        self.task_spec_hash = task_spec_hash  # the pool's task, which every signed assignment names
        self.attestations = attestations
        self.verdicts = _load_verdicts(attestations)  # work key -> validator -> its latest record
        self.config = config or ApiConfig()
        self.on_upload = on_upload
        self.on_assign = on_assign  # (node, counter handed out): lets the trainer persist counters before answering
        self.on_attest = on_attest  # (work key) after a verdict is recorded: a file may have become trainable
        self.pending = pending  # (node) its uploads the trainer has not trained on or dropped; None: not counted
        self.nonces = NonceCache(ttl=2 * self.config.max_skew)
        self._address_rate = RateLimiter(self.config.requests_per_address_per_s, burst=self.config.address_burst)
        self._signer_rate = RateLimiter(self.config.requests_per_signer_per_s, burst=self.config.signer_burst)
        self._handed: dict[str, tuple[int, int]] = {}  # node -> (step, assignments at that step)
        self.quota = UploadQuota(self.config.max_stored_bytes_per_node, self.config.max_stored_files_per_node)
        self._count_stored()
        self.metrics = Registry()
        self._requests = self.metrics.counter("coordinator_requests_total", "API requests by route and status.")
        self._uploads = self.metrics.counter("coordinator_uploads_total", "Rollout files stored.")
        self.metrics.gauge("coordinator_step", "Current policy step.", lambda: self.state.step)
        self.app = web.Application(middlewares=[self._errors], client_max_size=self.config.max_upload_bytes + 1)
        self.parser = UploadParser(self.config.parsing)  # its processes start with the first upload
        self.app.on_cleanup.append(self._close_parser)
        self.app.add_routes(
            [
                web.get("/v1/pool", self._pool),
                web.get("/v1/step", self._step),
                web.get("/v1/steps", self._steps),
                web.post("/v1/tasks", self._tasks),
                web.put("/v1/rollouts/{sha256}", self._upload),
                web.get("/v1/rollouts/{sha256}", self._download),
                web.get("/v1/rollouts/{sha256}/attestations", self._attestations),
                web.post("/v1/attestations", self._attest),
                web.get("/metrics", self._metrics),
            ]
        )

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
        try:
            response = await handler(request)
        except ApiError as exc:
            response = _json_error(exc.status, exc.code, exc.message)
            if exc.retry_after is not None:
                response.headers["Retry-After"] = f"{exc.retry_after:g}"
        except web.HTTPException as exc:  # no route, wrong method, body over client_max_size
            response = _json_error(exc.status, "http", exc.reason)
        self._requests.inc(route=route, status=str(response.status))
        return response

    # --- request checks ------------------------------------------------------------------------------

    async def _body(self, request: web.Request, limit: int) -> bytes:
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, "too_large", f"body of {request.content_length} bytes is over the {limit}-byte limit")
        body = await read_body(request.content, limit)
        if len(body) > limit:
            raise ApiError(413, "too_large", f"body is over the {limit}-byte limit")
        return body

    async def _signer(self, request: web.Request, body: bytes, role: str) -> str:
        """The signer of a request that holds `role` ("member" or "validator"), its nonce recorded only then.

        In this order, each cheaper than the next: the caller's address rate (no key needed to be refused), the
        signature, the signer's rate, the role (one chain lookup per unknown address, within a budget), and only
        then the nonce, so neither a stranger's requests nor its keys can fill the cache members' nonces go to."""
        now = time.time()
        self._rate_limit("address", request.remote or "?", now)
        try:
            checked = check_request(
                request.headers,
                self.domain,
                request.method,
                request.raw_path,
                body,
                pool_id=self.state.pool_id,
                host=request.host,  # the Host header: what the client addressed, which it signed
                now=now,
                max_skew=self.config.max_skew,
            )
        except RequestAuthError as exc:
            raise ApiError(_AUTH_STATUS[exc.code], exc.code.value, str(exc)) from None
        self._rate_limit("signer", checked.signer, now)
        try:
            allowed = await (self.roles.is_member if role == "member" else self.roles.is_validator)(checked.signer)
        except RoleLookupBusy as exc:
            raise ApiError(429, "busy", str(exc), retry_after=exc.retry_after) from None
        if not allowed:
            code, what = ("not_member", "a member") if role == "member" else ("not_validator", "a validator")
            raise ApiError(403, code, f"{checked.signer} is not {what} of pool {self.state.pool_id}")
        try:
            self.nonces.add(checked.signer, checked.nonce, now)
        except RequestAuthError as exc:
            raise ApiError(_AUTH_STATUS[exc.code], exc.code.value, str(exc)) from None
        return checked.signer

    def _rate_limit(self, kind: str, who: str, now: float) -> None:
        limiter = self._address_rate if kind == "address" else self._signer_rate
        if not limiter.allow(who, now):
            raise ApiError(429, "rate_limited", f"too many requests from {kind} {who}", retry_after=limiter.wait)

    async def _member(self, request: web.Request, body: bytes) -> str:
        return await self._signer(request, body, "member")

    # --- the stored-upload quota ---------------------------------------------------------------------

    def _oldest_step(self) -> int:
        """The oldest step whose uploads the trainer may still train on: files stored before it no longer count."""
        return self.state.step - self.config.async_level

    def _count_stored(self) -> None:
        """What the inbox holds that still counts (a restart), each file under the step current when it was
        written. Files written before the oldest step of the window was published are not opened."""
        oldest, history = self._oldest_step(), list(self.state.history)
        since = next((entry.at for entry in history if entry.step >= oldest), 0.0)
        for stored in self.inbox.stored(since):
            self.quota.hold(stored.node, stored.size, step_at(history, stored.stored_at, self.state.step))

    def _reserve(self, node: str, size: int) -> Reservation:
        try:
            return self.quota.reserve(node, size, self._oldest_step())
        except UploadQuotaExceeded as exc:
            raise ApiError(429, "quota", str(exc), retry_after=self.config.retry_after) from None

    # --- handlers ------------------------------------------------------------------------------------

    async def _pool(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"pool_id": self.state.pool_id, "trainer": self.state.trainer, "step": self.state.step}
        )

    async def _step(self, request: web.Request) -> web.Response:
        return web.json_response({"step": self.state.step})

    async def _steps(self, request: web.Request) -> web.Response:
        return web.json_response({"steps": [{"step": e.step, "at": e.at} for e in self.state.history]})

    async def _tasks(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.config.max_json_bytes)
        node = await self._member(request, body)
        step, handed = self._handed_now(node)
        if self._over_limit(node, step, handed):  # held until the trainer publishes the next step: answered as it does
            await self.state.wait_past(step, self.config.hold_seconds)
            step, handed = self._handed_now(node)
        if reason := self._over_limit(node, step, handed):
            raise ApiError(503, "no_work", reason, retry_after=self.config.retry_after)
        self._handed[node] = (step, handed + 1)
        counter = self.state.counters.get(node, 0)
        self.state.counters[node] = counter + 1
        if self.on_assign is not None:
            self.on_assign(node, counter)
        answer: dict[str, object] = {
            "pool_id": self.state.pool_id,
            "node": node,
            "step": step,
            "counter": counter,
            "prompts": self.config.prompts_per_task,
            "group_size": self.config.group_size,
        }
        if self.signer is not None and self.task_spec_hash is not None:
            grant = Assignment(
                self.state.pool_id, node, step, counter, self.config.prompts_per_task, self.config.group_size,
                self.task_spec_hash,
            )  # fmt: skip
            answer["task_spec_hash"] = "0x" + self.task_spec_hash.hex()
            answer["signature"] = "0x" + sign(grant, self.signer, self.domain).hex()
        return web.json_response(answer)

    def _over_limit(self, node: str, step: int, handed: int) -> str:
        """Why `node` gets no assignment now ("" when it does)."""
        limit = self.config.files_per_node_per_step
        if limit and handed >= limit:
            return f"{node} has its {limit} assignments of step {step}; more when the trainer publishes step {step + 1}"
        limit = self.config.pending_files_per_node
        if limit and self.pending is not None and (waiting := self.pending(node)) >= limit:
            return f"{node} has {waiting} uploads the trainer has not trained on yet; more once it trains on them"
        return ""

    def _handed_now(self, node: str) -> tuple[int, int]:
        """The current step, and the assignments `node` got at it."""
        step = self.state.step
        at_step, handed = self._handed.get(node, (step, 0))
        return step, handed if at_step == step else 0

    async def _upload(self, request: web.Request) -> web.Response:
        name = request.match_info["sha256"]
        if not _SHA256.fullmatch(name):
            raise ApiError(400, "bad_name", "the path must be /v1/rollouts/<64 lower-case hex digits of sha256>")
        body = await self._body(request, self.config.max_upload_bytes)
        node = await self._member(request, body)
        work_key, actual = bytes.fromhex(name), hashlib.sha256(body).digest()
        if actual != work_key:
            raise ApiError(400, "hash_mismatch", f"the body's sha256 is {actual.hex()}, not {name}")
        if self.inbox.has(work_key):  # stores nothing: never refused for the quota
            return web.json_response({"work_key": "0x" + name, "created": False, **self._receipt(work_key, node)})
        reservation = self._reserve(node, len(body))  # the bytes read, whatever was declared; before any await
        try:
            try:  # in a child process: the event loop keeps answering, and no file can take this process down
                meta = await self.parser.parse(body, self.config.max_upload_bytes)
            except UnparsedUpload as exc:  # malformed_file, too_large (its memory limit), parse_timeout, parser_died
                raise ApiError(413 if exc.code == "too_large" else 422, exc.code, exc.message) from None
            if meta.node != node:
                raise ApiError(403, "wrong_node", f"the file is for node {meta.node}; {node} signed the upload")
            if meta.pool_id != self.state.pool_id:
                raise ApiError(422, "wrong_pool", f"the file is for pool {meta.pool_id}, not {self.state.pool_id}")
            created = self.inbox.put(work_key, body, node)
            if created:
                reservation.keep(self.state.step)
        finally:
            reservation.close()  # not stored (refused, a failed write, or the same bytes stored meanwhile)
        if created:
            self._uploads.inc()
            if self.on_upload is not None:
                await self.on_upload(work_key, node)
        answer = {"work_key": "0x" + name, "created": created, **self._receipt(work_key, node)}
        return web.json_response(answer, status=201 if created else 200)

    async def _close_parser(self, app: web.Application) -> None:
        await self.parser.close()

    def _receipt(self, work_key: bytes, node: str) -> dict[str, str]:
        """The trainer-signed `UploadReceipt` for the node that stored the file ({} without a signing key, or for
        another node re-sending bytes someone else uploaded first)."""
        if self.signer is None or self.inbox.uploader(work_key) != node:
            return {}
        receipt = UploadReceipt(self.state.pool_id, work_key, node)
        return {"receipt": "0x" + sign(receipt, self.signer, self.domain).hex()}

    async def _download(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["sha256"]
        if not _SHA256.fullmatch(name):
            raise ApiError(404, "not_found", f"no rollout file {name}")
        work_key = bytes.fromhex(name)
        if self.inbox.lost(work_key):  # acknowledged, then lost here: no worker may be slashed for it
            raise ApiError(410, "lost", f"rollout file {name} was stored and acknowledged, and is gone")
        if not self.inbox.has(work_key):
            raise ApiError(404, "not_found", f"no rollout file {name}")
        return web.FileResponse(self.inbox.path(work_key))

    async def _attest(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.config.max_json_bytes)
        signer = await self._signer(request, body, "validator")
        try:
            raw = loads_bounded(body, 2)
            attestation = Attestation(
                pool_id=self.state.pool_id,
                work_key=bytes.fromhex(str(raw["work_key"]).removeprefix("0x")),
                accepted=raw["accepted"],
                reason=raw["reason"],
            )
            signature = bytes.fromhex(str(raw["signature"]).removeprefix("0x"))
            attester = recover(attestation, signature, self.domain)
        except (ValueError, KeyError, TypeError, SignatureError) as exc:
            raise ApiError(400, "bad_attestation", f"not a signed attestation: {exc}") from None
        if attester != signer or not is_checksum_address(attester):
            raise ApiError(400, "bad_attestation", f"the attestation is signed by {attester}, the request by {signer}")
        with self.attestations.open("a+b") as log:
            record = {
                "work_key": "0x" + attestation.work_key.hex(),
                "accepted": attestation.accepted,
                "reason": attestation.reason,
                "validator": signer,
                "signature": "0x" + signature.hex(),
            }
            line = json.dumps(record, sort_keys=True).encode() + b"\n"
            if log.tell() and (log.seek(-1, 2), log.read(1))[1] != b"\n":  # a line cut by a crash stays on its own
                line = b"\n" + line
            log.write(line)
        self.verdicts.setdefault(attestation.work_key, {})[signer] = record
        if self.on_attest is not None:
            self.on_attest(attestation.work_key)
        return web.json_response({"recorded": True}, status=201)

    async def _attestations(self, request: web.Request) -> web.Response:
        name = request.match_info["sha256"]
        if not _SHA256.fullmatch(name) or not self.inbox.has(bytes.fromhex(name)):
            raise ApiError(404, "not_found", f"no rollout file {name}")
        found = self.verdicts.get(bytes.fromhex(name), {})
        return web.json_response({"work_key": "0x" + name, "attestations": [found[v] for v in sorted(found)]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(), content_type="text/plain")
