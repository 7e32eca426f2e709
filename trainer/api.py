"""The coordinator API the trainer serves (DESIGN section 8): the aiohttp layer over `CoordinatorService`.

The routes are `protocol.coordinator.routes`'s (its table says who may call each and what it answers); the messages are
`protocol.coordinator`'s schemas, the same the nodes' client (`protocol/coordinator/client.py`) reads and writes. What
is decided here: which route a request takes, reading its body within a limit, who signed it, and how an answer or a
refusal is written. What the coordinator does with a request (assignments and their limits, uploads and the quota,
verdicts) is `trainer/coordinator.py`'s.

Every signed request carries the EIP-712 `Request` headers (DESIGN section 5), and the client's declared sha256 of
its body (`X-Prime-Body-Sha256`, which the signature covers): so a request is authenticated before a byte of its
body is read (issue 32, attack 3). The checks, each cheaper than the next: the caller's address rate (no key needed
to be refused), the signature over the declared hash, the signer's rate, the role (one chain lookup per unknown
address, within a budget), for an upload the signer's quota for its declared size, and then the nonce is recorded;
only then is the body streamed, against its size limit and its time (`ConnectionLimits.body_deadline`), and its
sha256 compared with the declared one (`body_mismatch`; an upload's path names it: `hash_mismatch`). A request
refused after its nonce was recorded gives the nonce back, so a refused request consumes none, and the nonces are
kept in a window per signer (`protocol.signing.NonceCache`). An upload from a client that does not declare the hash is
still authenticated first, by the sha256 its path names; a JSON request without it is read first, as before, but
only a few such bodies at a time per address and in all (429 `busy` past them). A refusal whose body was not read
closes the connection. A batch's leaf list (`PUT /v1/batches/{root}`) is signed as a JSON request is (its path names
a Merkle root, not the body's sha256), refused unread past `protocol.batches.MAX_BATCH_BYTES`, and checked against the
signer's quota of lists before its body is read. Each refusal is a 4xx JSON body `{"error": code, "message": text}`
with its own code (`protocol.coordinator.errors`); one worth retrying later has a Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

from aiohttp import web

from core.bodies import HeapTrim, read_body
from core.metrics import Registry, metrics_response
from core.ratelimit import RateLimiter
from core.safejson import loads_bounded
from protocol.batches import MAX_BATCH_BYTES, MEDIA_TYPE
from protocol.coordinator import routes
from protocol.coordinator.errors import STATUS, ErrorBody, ErrorCode, ProtocolError
from protocol.coordinator.rollouts import AttestationBody, Recorded
from protocol.signing import (
    HEADER_BODY_HASH,
    NonceCache,
    RequestAuthError,
    SignedRequest,
    check_request_hash,
    declared_body_hash,
)
from trainer.coordinator import CoordinatorService, Refused

__all__ = ["CoordinatorApi"]


_SIGNED = web.RequestKey("prime_signed", bool)  # set on a request once its signature checked out
_STRANGERS = {ErrorCode.NOT_MEMBER, ErrorCode.NOT_VALIDATOR}  # validly signed, by a key that holds no role


def _json_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response(ErrorBody(code, message).to_json(), status=status)


class _Message(Protocol):
    def to_json(self) -> dict[str, Any]: ...


def _answer(message: _Message, status: int = 200) -> web.Response:
    return web.json_response(message.to_json(), status=status)


class CoordinatorApi:
    """The aiohttp application (`app`) serving `service`; its request counters and gauges are in `metrics`."""

    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self.config = config = service.config
        self.nonces = NonceCache(max_skew=config.max_skew, max_entries=config.max_nonces)
        self._unsigned_bodies: dict[str, int] = {}  # bodies read before their signature is checked, per address
        self._trim = HeapTrim()
        self._address_rate = RateLimiter(config.requests_per_address_per_s, burst=config.address_burst)
        self._signer_rate = RateLimiter(config.requests_per_signer_per_s, burst=config.signer_burst)
        self.metrics = Registry()
        self._requests = self.metrics.counter("coordinator_requests_total", "API requests by route and status.")
        self._uploads = self.metrics.counter("coordinator_uploads_total", "Rollout files stored.")
        self._batches = self.metrics.counter("coordinator_batches_total", "Leaf lists of batches stored.")
        self.metrics.gauge("coordinator_step", "Current policy step.", lambda: service.state.step)
        self.app = web.Application(middlewares=[self._errors], client_max_size=config.max_upload_bytes + 1)
        self.app.on_cleanup.append(self._close)
        self.app.add_routes(
            [
                web.get(routes.POOL, self._pool),
                web.get(routes.STEP, self._step),
                web.get(routes.STEPS, self._steps),
                web.post(routes.TASKS, self._tasks),
                web.put(routes.ROLLOUT, self._upload),
                web.get(routes.ROLLOUT, self._download),
                web.get(routes.ROLLOUT_ATTESTATIONS, self._attestations),
                web.put(routes.BATCH, self._upload_batch),
                web.get(routes.BATCH, self._download_batch),
                web.post(routes.ATTESTATIONS, self._attest),
                web.get(routes.METRICS, self._metrics),
            ]
        )

    async def _close(self, app: web.Application) -> None:
        await self.service.close()

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
        code: str | None = None
        try:
            response = await handler(request)
        except Refused as exc:
            code, response = exc.code, _json_error(STATUS[exc.code], exc.code, exc.message)
            if exc.retry_after is not None:
                response.headers["Retry-After"] = f"{exc.retry_after:g}"
        except web.HTTPException as exc:  # no route, wrong method, body over client_max_size
            response = _json_error(exc.status, ErrorCode.HTTP, exc.reason)
        self._requests.inc(route=route, status=str(response.status))
        if request.content.is_eof():
            return response
        # refused before its body was read: the connection goes with the body. A signer refused for its rate, quota
        # or clock may still be sending: aiohttp drains the rest for `lingering_time` so that it reads the answer. A
        # request that is not validly signed by a member or validator is not drained: its answer is written and the
        # connection closed at once (draining strangers' 60 MiB bodies was most of the coordinator's work under them).
        response.force_close()
        if code in _STRANGERS or not request.get(_SIGNED, False):
            with contextlib.suppress(ConnectionResetError):  # it went away first: nothing to answer
                await response.prepare(request)
                await response.write_eof()
            request.protocol.force_close()
        return response

    # --- bodies and signers --------------------------------------------------------------------------

    async def _body(self, request: web.Request, limit: int, declared: bytes | None = None) -> bytes:
        """The body, at most `limit` bytes, within its time; its sha256 must be `declared` when that is given."""
        size = request.content_length
        if size is not None and size > limit:
            raise Refused(ErrorCode.TOO_LARGE, f"body of {size} bytes is over the {limit}-byte limit")
        seconds = self.config.connections.body_deadline(limit if size is None else size)
        try:
            async with asyncio.timeout(seconds):
                body = await read_body(request.content, limit)
        except TimeoutError:
            raise Refused(ErrorCode.BODY_TIMEOUT, f"the body did not arrive within {seconds:.0f} s") from None
        except (ConnectionResetError, web.RequestPayloadError) as exc:  # the client went away: counted, not a traceback
            raise Refused(ErrorCode.INCOMPLETE_BODY, f"the connection ended before the body did: {exc}") from None
        finally:
            if (size or limit) >= 1 << 20:  # a second from now, what a large body held goes back to the system
                self._trim.soon()
        if len(body) > limit:
            raise Refused(ErrorCode.TOO_LARGE, f"body is over the {limit}-byte limit")
        if declared is not None and (actual := hashlib.sha256(body).digest()) != declared:
            message = f"the body's sha256 is {actual.hex()}, not the {declared.hex()} its headers declared"
            raise Refused(ErrorCode.BODY_MISMATCH, message)
        return body

    @asynccontextmanager
    async def _signed_body(
        self, request: web.Request, role: str, limit: int, admit: Callable[[str], None] | None = None
    ) -> AsyncIterator[tuple[str, bytes]]:
        """The signer (holding `role`) of a request and its body, for the block that answers it (a refusal in it
        gives the nonce back). Authenticated before the body is read when the client declares the body's sha256,
        else read first within the unsigned bodies' bounds. `admit` (the signer) may refuse it once it is
        authenticated, before a declared body is read (a quota)."""
        declared = self._declared(request)
        body = b""
        if declared is None:
            async with self._unsigned_body(request.remote or "?"):
                body = await self._body(request, limit)
            checked = await self._authenticate(request, role, hashlib.sha256(body).digest())
        else:
            checked = await self._authenticate(request, role, declared)
        async with self._nonce_given_back_on_refusal(checked):
            if admit is not None:
                admit(checked.signer)
            if declared is not None:
                body = await self._body(request, limit, declared)
            yield checked.signer, body

    @staticmethod
    def _declared(request: web.Request) -> bytes | None:
        try:
            return declared_body_hash(request.headers)
        except RequestAuthError as exc:
            raise Refused(ErrorCode(exc.code.value), str(exc)) from None

    @asynccontextmanager
    async def _unsigned_body(self, address: str) -> AsyncIterator[None]:
        """A place for one body read before its signature is checked; 429 busy when the address or all have none."""
        held = self._unsigned_bodies.get(address, 0)
        if held >= self.config.unsigned_bodies_per_address or sum(self._unsigned_bodies.values()) >= (
            self.config.unsigned_bodies
        ):
            message = f"too many unsigned bodies in flight; declare the body's sha256 in {HEADER_BODY_HASH}"
            raise Refused(ErrorCode.BUSY, message, retry_after=self.config.retry_after)
        self._unsigned_bodies[address] = held + 1
        try:
            yield
        finally:
            left = self._unsigned_bodies[address] - 1
            if left:
                self._unsigned_bodies[address] = left
            else:
                del self._unsigned_bodies[address]

    async def _authenticate(self, request: web.Request, role: str, body_hash: bytes) -> SignedRequest:
        """The signed request, by a signer holding `role` ("member" or "validator"), for a body of sha256
        `body_hash`; its nonce recorded only once every check of the signer has passed."""
        now = time.time()
        self._rate_limit("address", request.remote or "?", now)
        try:
            checked = check_request_hash(
                request.headers,
                self.service.domain,
                request.method,
                request.raw_path,
                body_hash,
                pool_id=self.service.state.pool_id,
                host=request.host,  # the Host header: what the client addressed, which it signed
                now=now,
                max_skew=self.config.max_skew,
            )
        except RequestAuthError as exc:
            raise Refused(ErrorCode(exc.code.value), str(exc)) from None
        request[_SIGNED] = True
        self._rate_limit("signer", checked.signer, now)
        await self.service.authorize(checked.signer, role)
        try:
            self.nonces.add(checked.signer, checked.nonce, checked.timestamp, now)
        except RequestAuthError as exc:
            raise Refused(ErrorCode(exc.code.value), str(exc)) from None
        return checked

    @asynccontextmanager
    async def _nonce_given_back_on_refusal(self, checked: SignedRequest) -> AsyncIterator[None]:
        """A request that fails inside the block (refused, cut off, timed out) did not consume its nonce."""
        try:
            yield
        except BaseException:
            self.nonces.discard(checked.signer, checked.nonce)
            raise

    def _rate_limit(self, kind: str, who: str, now: float) -> None:
        limiter = self._address_rate if kind == "address" else self._signer_rate
        if not limiter.allow(who, now):
            message = f"too many requests from {kind} {who}"
            raise Refused(ErrorCode.RATE_LIMITED, message, retry_after=limiter.wait)

    # --- handlers ------------------------------------------------------------------------------------

    async def _pool(self, request: web.Request) -> web.Response:
        return _answer(self.service.pool())

    async def _step(self, request: web.Request) -> web.Response:
        return _answer(self.service.step())

    async def _steps(self, request: web.Request) -> web.Response:
        return _answer(self.service.steps())

    async def _tasks(self, request: web.Request) -> web.Response:
        async with self._signed_body(request, "member", self.config.max_json_bytes) as (node, _):  # `{}` by convention
            return _answer(await self.service.assign(node))

    async def _upload(self, request: web.Request) -> web.Response:
        work_key = routes.work_key_of(request.match_info["sha256"])
        if work_key is None:
            message = "the path must be /v1/rollouts/<64 lower-case hex digits of sha256>"
            raise Refused(ErrorCode.BAD_NAME, message)
        declared = self._declared(request)
        if declared is not None and declared != work_key:
            message = f"the body's sha256 is {declared.hex()} ({HEADER_BODY_HASH}), not {work_key.hex()}"
            raise Refused(ErrorCode.HASH_MISMATCH, message)
        limit = self.config.max_upload_bytes
        if request.content_length is not None and request.content_length > limit:
            raise Refused(ErrorCode.TOO_LARGE, f"body of {request.content_length} bytes is over the {limit}-byte limit")
        checked = await self._authenticate(request, "member", work_key)  # the path names the body's sha256
        async with self._nonce_given_back_on_refusal(checked):
            self.service.check_quota(work_key, checked.signer, request.content_length or 0)
            body = await self._body(request, limit)  # the service compares its sha256 with the path's
            upload = await self.service.upload(work_key, body, checked.signer)
        if upload.created:
            self._uploads.inc()
        return _answer(upload, 201 if upload.created else 200)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["sha256"]
        work_key = routes.work_key_of(name)
        if work_key is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no rollout file {name}")
        return web.FileResponse(self.service.stored_file(work_key))

    async def _upload_batch(self, request: web.Request) -> web.Response:
        root = routes.root_of(request.match_info["root"])
        if root is None:
            raise Refused(ErrorCode.BAD_NAME, "the path must be /v1/batches/<64 lower-case hex digits of the root>")
        size = request.content_length
        if size is not None and size > MAX_BATCH_BYTES:
            raise Refused(ErrorCode.TOO_LARGE, f"body of {size} bytes is over the {MAX_BATCH_BYTES}-byte limit")
        quota = functools.partial(self.service.check_batch_quota, root)
        async with self._signed_body(request, "member", MAX_BATCH_BYTES, admit=quota) as (node, body):
            upload = await self.service.upload_batch(root, body, node)
        if upload.created:
            self._batches.inc()
        return _answer(upload, 201 if upload.created else 200)

    async def _download_batch(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["root"]
        root = routes.root_of(name)
        if root is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no leaf list {name}")
        return web.FileResponse(self.service.stored_batch(root), headers={"Content-Type": MEDIA_TYPE})

    async def _attest(self, request: web.Request) -> web.Response:
        async with self._signed_body(request, "validator", self.config.max_json_bytes) as (signer, body):
            try:
                attestation = AttestationBody.from_json(loads_bounded(body, routes.MAX_REQUEST_DEPTH))
            except (ValueError, ProtocolError) as exc:  # ValueError: not JSON (or nested past the limit)
                raise Refused(ErrorCode.BAD_ATTESTATION, f"not a signed attestation: {exc}") from None
            self.service.attest(signer, attestation)
            return _answer(Recorded(), 201)

    async def _attestations(self, request: web.Request) -> web.Response:
        name = request.match_info["sha256"]
        work_key = routes.work_key_of(name)
        if work_key is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no rollout file {name}")
        return _answer(self.service.attestations(work_key))

    async def _metrics(self, request: web.Request) -> web.Response:
        return metrics_response(self.metrics)
