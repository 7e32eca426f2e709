"""A node's client of the trainer's coordinator API (DESIGN section 8): signed requests, typed answers.

Transport here, protocol in `protocol.coordinator`: the routes, the message schemas both ends use, the error codes.
Every signed request carries the EIP-712 `Request` headers of `protocol.signing.sign_request`, over the exact path and
body sent, with the body's sha256 declared in `X-Prime-Body-Sha256`: the coordinator checks the signature, the signer's
role, rate and quota on the headers alone, and only then reads the body. A 4xx answer raises `CoordinatorRefused` with
the server's error code and message; a connection failure, a timeout, a 5xx, a 429 (rate limited, busy, over
the upload quota: `CoordinatorBusy`) or an answer that does not fit its schema raises `CoordinatorUnavailable`,
which a caller may retry.

A batch's leaf list is uploaded with `upload_batch` and read back with `download_batch`, which checks that the list
it is served hashes to the root it asked for: a coordinator serving other leaves is the coordinator's failure
(`CoordinatorUnavailable`), never evidence against the worker.

Every call has a total timeout (`ClientLimits`: one for the small JSON calls, a longer one for a file's upload or
download) and waits for one of `concurrency` slots first, so a coordinator that stops answering costs a caller
a bounded wait and a bounded number of connections. `CoordinatorClient.connect` opens a session of the client's
own; a session passed in (the older form) is used as it is, under the same timeouts and bound.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

import aiohttp
from eth_account.signers.local import LocalAccount

from core.bodies import read_body
from core.errors import NodeError
from core.safejson import loads_bounded
from ledger.merkle import BatchTree, Leaf
from protocol.batches import MAX_BATCH_BYTES, MAX_BATCH_LEAVES, LeafListError, decode_leaves, encode_leaves
from protocol.coordinator import routes
from protocol.coordinator.errors import ErrorBody, ErrorCode, ProtocolError
from protocol.coordinator.pool import PoolInfo, PublishedStep, StepHistory, StepInfo, TaskGrant
from protocol.coordinator.rollouts import AttestationBody, AttestationList, BatchUpload, Recorded, Upload, Verdict
from protocol.plan import Job
from protocol.signing import Attestation, SignatureError, SigningDomain, recover, sign, sign_request

__all__ = [  # the wire types are re-exported for the callers that take them from here (the worker, the validator)
    "BatchUpload",
    "ClientLimits",
    "CoordinatorBusy",
    "CoordinatorClient",
    "CoordinatorError",
    "CoordinatorLostFile",
    "CoordinatorRefused",
    "CoordinatorUnavailable",
    "NoWorkYet",
    "PublishedStep",
    "Upload",
    "Verdict",
]


class CoordinatorError(NodeError):
    """A request to the coordinator failed."""


class CoordinatorUnavailable(CoordinatorError):
    """The coordinator could not be reached in time, answered 5xx, or answered what its protocol does not allow;
    worth retrying."""


class NoWorkYet(CoordinatorUnavailable):
    """The node has all its assignments of the current step (503 `no_work`); ask again after `retry_after`."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CoordinatorBusy(CoordinatorUnavailable):
    """429: over a rate, the role lookups are busy, or an upload would pass the node's quota (`code`); ask again
    after `retry_after`. A file refused this way is not the coordinator's to keep: its sender keeps it."""

    def __init__(self, code: str, message: str, retry_after: float) -> None:
        super().__init__(f"coordinator busy (429 {code}): {message}")
        self.code, self.retry_after = code, retry_after


class CoordinatorRefused(CoordinatorError):
    """The coordinator refused the request (4xx) with a JSON error."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"coordinator refused ({status} {code}): {message}")
        self.status, self.code, self.message = status, code, message


class CoordinatorLostFile(CoordinatorError):
    """The coordinator acknowledged the file once and no longer has it (410): its loss, never the worker's fault."""


@dataclass(frozen=True)
class ClientLimits:
    """How long one call to the coordinator may take, and how many run at once."""

    # seconds a JSON call may take in all; above the coordinator's hold of `POST /v1/tasks` (10 s by default)
    call_timeout: float = 30.0
    # seconds an upload or a download of one rollout file may take in all (files of up to 64 MiB)
    transfer_timeout: float = 300.0
    connect_timeout: float = 10.0  # seconds to open a connection, within either of the above
    concurrency: int = 8  # calls in flight at once; more wait for a slot (the wait is not timed)

    def __post_init__(self) -> None:
        if not (self.call_timeout > 0 and self.transfer_timeout > 0 and self.connect_timeout > 0):
            raise ValueError("the coordinator client's timeouts must be positive")
        if not 1 <= self.concurrency <= 256:
            raise ValueError(f"concurrency must be 1 to 256, got {self.concurrency}")


class CoordinatorClient:
    """A client of one pool's coordinator at `url`. Signed requests name the pool and the URL's host, so they are
    good at that coordinator only; without `pool_id` the client asks the coordinator (`GET /v1/pool`) once.

    `CoordinatorClient.connect(url, account, domain, ...)` is the usual way to make one (its own session, closed
    with it); `CoordinatorClient(session, url, account, domain, ...)` uses a session the caller owns."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        account: LocalAccount,
        domain: SigningDomain,
        *,
        pool_id: int | None = None,
        limits: ClientLimits | None = None,
    ) -> None:
        self.session, self.url, self.account, self.domain = session, url.rstrip("/"), account, domain
        self.pool_id = pool_id
        self.host = urllib.parse.urlsplit(self.url).netloc
        self.limits = limits or ClientLimits()
        self._slots = asyncio.Semaphore(self.limits.concurrency)

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        url: str,
        account: LocalAccount,
        domain: SigningDomain,
        *,
        pool_id: int | None = None,
        limits: ClientLimits | None = None,
    ) -> AsyncIterator[CoordinatorClient]:
        """A client on a session of its own (at most `concurrency` connections), closed when the block ends."""
        limits = limits or ClientLimits()
        connector = aiohttp.TCPConnector(limit=limits.concurrency)
        timeout = aiohttp.ClientTimeout(total=limits.transfer_timeout, sock_connect=limits.connect_timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            yield cls(session, url, account, domain, pool_id=pool_id, limits=limits)

    @asynccontextmanager
    async def _exchange(
        self, method: str, url: str, total: float, **options: Any
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One request to `url` once a slot is free, its answer read in the block, all within `total` seconds; a
        timeout or a failed connection, in the block too, is `CoordinatorUnavailable` naming the method and URL."""
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=min(total, self.limits.connect_timeout))
        async with self._slots:
            try:
                async with (
                    asyncio.timeout(total),  # the whole exchange, whatever the session's own timeout is
                    self.session.request(method, url, timeout=timeout, **options) as response,
                ):
                    yield response
            except TimeoutError as exc:
                raise CoordinatorUnavailable(f"{method} {url}: no answer within {total:g} s") from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise CoordinatorUnavailable(f"{method} {url}: {exc or type(exc).__name__}") from exc

    async def _call(self, method: str, path: str, body: bytes = b"", *, signed: bool, transfer: bool = False) -> Any:
        """The JSON answer of one call (not yet checked against its schema), or the exception its status means."""
        headers: dict[str, str] = {}
        if signed:
            if self.pool_id is None:
                self.pool_id = await self._pool_id()
            headers = sign_request(self.account, self.domain, method, path, body, pool_id=self.pool_id, host=self.host)
        total = self.limits.transfer_timeout if transfer else self.limits.call_timeout
        limit = routes.MAX_ANSWER_BYTES
        async with self._exchange(method, self.url + path, total, data=body or None, headers=headers) as response:
            raw = await read_body(response.content, limit)
            status = response.status
            retry_after = response.headers.get("Retry-After", "")
        if len(raw) > limit:
            raise CoordinatorUnavailable(f"{method} {path}: answer over {limit} bytes")
        try:
            answer = loads_bounded(raw, routes.MAX_ANSWER_DEPTH)
        except ValueError:
            answer = None
        if status == 503 and isinstance(answer, dict) and answer.get("error") == ErrorCode.NO_WORK:
            message = ErrorBody.from_answer(answer, raw).message
            raise NoWorkYet(message, _retry_after(retry_after, default=1.0))
        if status == 429:
            error = ErrorBody.from_answer(answer, raw)
            raise CoordinatorBusy(error.error, error.message, _retry_after(retry_after, default=1.0))
        if status >= 500:
            raise CoordinatorUnavailable(f"{method} {path}: HTTP {status}")
        if status >= 400:
            error = ErrorBody.from_answer(answer, raw)
            raise CoordinatorRefused(status, error.error, error.message)
        if not isinstance(answer, dict):
            raise CoordinatorUnavailable(f"{method} {path}: the answer is not a JSON object")
        return answer

    async def _pool_id(self) -> int:
        return _parse(PoolInfo, await self._call("GET", routes.POOL, signed=False), routes.POOL).pool_id

    async def step(self) -> int:
        return _parse(StepInfo, await self._call("GET", routes.STEP, signed=False), routes.STEP).step

    async def steps(self) -> list[PublishedStep]:
        """The recent steps and when each became current, oldest first (a bounded history)."""
        return list(_parse(StepHistory, await self._call("GET", routes.STEPS, signed=False), routes.STEPS).steps)

    async def attestations(self, work_key: bytes, pool_id: int) -> list[Verdict]:
        """The verdicts validators posted on a file; one whose signature does not match its validator is dropped.

        Checking the signatures means a coordinator cannot show a worker an acceptance nobody signed; whether the
        signer is one of the pool's validators is for the caller to ask the chain.
        """
        path = routes.rollout_attestations(work_key)
        listed = _parse(AttestationList, await self._call("GET", path, signed=False), path)
        verdicts = []
        for entry in listed.attestations:
            message = Attestation(pool_id, work_key, entry.accepted, entry.reason)  # the key asked about, not its own
            try:
                signer = recover(message, entry.signature, self.domain)
            except SignatureError:
                continue
            if signer == entry.validator:
                verdicts.append(Verdict(signer, entry.accepted, entry.reason))
        return verdicts

    async def holds(self, work_key: bytes, *, timeout: float | None = None) -> bool:
        """Whether the coordinator serves the file now (HEAD): False when it never had it (404) or lost it (410)."""
        url = self.url + routes.rollout(work_key)
        total = self.limits.call_timeout if timeout is None else timeout
        async with self._exchange("HEAD", url, total, allow_redirects=False) as response:  # as session.head
            status = response.status
        if status in (404, 410):
            return False
        if status >= 500:
            raise CoordinatorUnavailable(f"HEAD {url}: HTTP {status}")
        if status != 200:
            raise CoordinatorRefused(status, ErrorCode.HTTP, f"HEAD {url} answered HTTP {status}")
        return True

    async def download(self, work_key: bytes, max_bytes: int, *, timeout: float | None = None) -> bytes | None:
        """An uploaded file's bytes, None when the coordinator has no such file (404).

        Reads at most `max_bytes + 1` bytes: enough for a size check to refuse a larger file without holding it all.
        """
        total = self.limits.transfer_timeout if timeout is None else timeout
        # a longer file is read in part and judged by its size: its bytes are the worker's, named by their hash
        return await self._stored(routes.rollout(work_key), "file", max_bytes, total, refuse_longer=False)

    async def _stored(
        self, path: str, what: str, max_bytes: int, timeout: float, *, refuse_longer: bool
    ) -> bytes | None:
        """A stored object's bytes (at most `max_bytes + 1` of them read), None on 404; `CoordinatorLostFile` on 410
        (stored, acknowledged and lost). With `refuse_longer`, a declared length over `max_bytes` is the
        coordinator's failure, refused before anything is read."""
        url = self.url + path
        async with self._exchange("GET", url, timeout) as response:
            if response.status == 404:
                return None
            if response.status == 410:
                raise CoordinatorLostFile(f"GET {url}: the coordinator acknowledged this {what} and lost it")
            if response.status >= 500:
                raise CoordinatorUnavailable(f"GET {url}: HTTP {response.status}")
            if response.status != 200:
                raise CoordinatorRefused(response.status, ErrorCode.HTTP, f"GET {url} answered HTTP {response.status}")
            size = response.content_length
            if refuse_longer and size is not None and size > max_bytes:
                raise CoordinatorUnavailable(f"GET {url}: a {what} of {size} bytes, over {max_bytes}")
            return await read_body(response.content, max_bytes)

    async def request_task(self) -> Job:
        """The next assignment for this node; the coordinator chooses the step and the counter."""
        answer = await self._call("POST", routes.TASKS, routes.TASK_REQUEST_BODY, signed=True)
        grant = _parse(TaskGrant, answer, routes.TASKS)
        if grant.node != self.account.address:
            raise CoordinatorUnavailable(f"{routes.TASKS} answered a task for {grant.node}, not {self.account.address}")
        return Job(
            pool_id=grant.pool_id,
            node=grant.node,
            step=grant.step,
            counter=grant.counter,
            prompts=grant.prompts,
            group_size=grant.group_size,
            signature=grant.signature,
            issued_at=grant.issued_at,
        )

    async def upload(self, work_key: bytes, data: bytes) -> Upload:
        """Stores the file; the receipt comes back unchecked (the caller knows the trainer to check it against)."""
        path = routes.rollout(work_key)
        upload = _parse(Upload, await self._call("PUT", path, data, signed=True, transfer=True), path)
        if upload.work_key != work_key:
            raise CoordinatorUnavailable(f"PUT {path} answered for another file, 0x{upload.work_key.hex()}")
        return upload

    async def upload_batch(self, leaves: Sequence[Leaf]) -> BatchUpload:
        """Stores a batch's leaf list under its Merkle root once the coordinator holds every file it names (409
        `missing_files` otherwise). The receipt comes back unchecked: `BatchUpload.receipt_signer` recovers who
        signed it, for the caller to compare with the pool's trainer."""
        body = encode_leaves(leaves)  # `LeafListError` for a list no coordinator takes: none, too many, 0 units
        tree = BatchTree(leaves)
        path = routes.batch(tree.root)
        upload = _parse(BatchUpload, await self._call("PUT", path, body, signed=True), path)
        if (upload.root, upload.count) != (tree.root, tree.count):
            message = f"PUT {path} answered for another list, 0x{upload.root.hex()} of {upload.count} leaves"
            raise CoordinatorUnavailable(message)
        return upload

    async def download_batch(self, root: bytes, *, timeout: float | None = None) -> tuple[Leaf, ...] | None:
        """A batch's leaf list, None when the coordinator never had it (404); `CoordinatorLostFile` when it had it
        and lost it (410). A list over `MAX_BATCH_BYTES`, that does not decode or that hashes to another root is
        `CoordinatorUnavailable`: what the coordinator serves is its own doing, never the worker's."""
        url = self.url + routes.batch(root)
        total = self.limits.call_timeout if timeout is None else timeout
        data = await self._stored(routes.batch(root), "leaf list", MAX_BATCH_BYTES, total, refuse_longer=True)
        if data is None:
            return None
        if len(data) > MAX_BATCH_BYTES:
            raise CoordinatorUnavailable(f"GET {url}: a leaf list over {MAX_BATCH_BYTES} bytes")
        try:
            leaves = decode_leaves(data, max_leaves=MAX_BATCH_LEAVES)
        except LeafListError as exc:
            raise CoordinatorUnavailable(f"GET {url}: served a list that is not one: {exc}") from None
        served = BatchTree(leaves).root
        if served != root:
            raise CoordinatorUnavailable(f"GET {url}: served leaves whose root is 0x{served.hex()}, not the one named")
        return leaves

    async def attest(self, attestation: Attestation) -> None:
        """Posts a validator's signed verdict (the attestation is signed by this client's account)."""
        signature = sign(attestation, self.account, self.domain)
        body = AttestationBody(attestation.work_key, attestation.accepted, attestation.reason, signature)
        answer = await self._call("POST", routes.ATTESTATIONS, _json(body.to_json()), signed=True)
        _parse(Recorded, answer, routes.ATTESTATIONS)


class _Message(Protocol):
    @classmethod
    def from_json(cls, value: object) -> Self: ...


_M = TypeVar("_M", bound=_Message)


def _parse(schema: type[_M], answer: object, path: str) -> _M:
    """`schema.from_json(answer)`; an answer that does not fit is the coordinator's fault: worth retrying."""
    try:
        return schema.from_json(answer)
    except ProtocolError as exc:
        raise CoordinatorUnavailable(f"{path} answered an invalid {exc}") from None


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


def _retry_after(text: str, *, default: float) -> float:
    """A Retry-After in seconds, bounded to [0.1, 30] whatever a coordinator sends."""
    try:
        value = float(text)
    except ValueError:
        return default
    return min(30.0, max(0.1, value)) if value == value else default
