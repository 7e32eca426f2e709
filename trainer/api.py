"""The coordinator API the trainer serves (DESIGN section 8): the aiohttp layer over `CoordinatorService`.

The routes are `node.protocol.routes`'s (its table says who may call each and what it answers); the messages are
`node.protocol`'s schemas, the same the nodes' client (`node/coordinator.py`) reads and writes. What is decided
here: which route a request takes, reading its body within a limit, who signed it, and how an answer or a
refusal is written. What the coordinator does with a request (assignments and their limits, uploads and the
quota, verdicts) is `trainer/coordinator.py`'s.

Every signed request carries the EIP-712 `Request` headers (DESIGN section 5). The order of checks on an upload
is cheapest first: the declared size, the bounded body read, the signature (timestamp, signer, nonce), the
signer's role, then the service's checks (the body's sha256 against the name, the signer's quota, the file's
format and its node and pool, parsed off the event loop). The checks of a signer are, each cheaper than the next:
the caller's address rate (no key needed to be refused), the signature, the signer's rate, the role (one chain
lookup per unknown address, within a budget), and only then the nonce, so neither a stranger's requests nor its
keys can fill the cache members' nonces go to. Each refusal is a 4xx JSON body `{"error": code, "message": text}`
with its own code (`node.protocol.errors`); one worth retrying later has a Retry-After.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from node.bodies import read_body
from node.metrics import Registry, metrics_response
from node.protocol import routes
from node.protocol.errors import STATUS, ErrorBody, ErrorCode, ProtocolError
from node.protocol.rollouts import AttestationBody, Recorded
from node.ratelimit import RateLimiter
from node.safejson import loads_bounded
from node.signing import NonceCache, RequestAuthError, check_request
from trainer.coordinator import ApiConfig, CoordinatorService, Refused

__all__ = ["ApiConfig", "CoordinatorApi"]  # ApiConfig is the service's, named here for trainer.config


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
        self.nonces = NonceCache(ttl=2 * config.max_skew)
        self._address_rate = RateLimiter(config.requests_per_address_per_s, burst=config.address_burst)
        self._signer_rate = RateLimiter(config.requests_per_signer_per_s, burst=config.signer_burst)
        self.metrics = Registry()
        self._requests = self.metrics.counter("coordinator_requests_total", "API requests by route and status.")
        self._uploads = self.metrics.counter("coordinator_uploads_total", "Rollout files stored.")
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
        try:
            response = await handler(request)
        except Refused as exc:
            response = _json_error(STATUS[exc.code], exc.code, exc.message)
            if exc.retry_after is not None:
                response.headers["Retry-After"] = f"{exc.retry_after:g}"
        except web.HTTPException as exc:  # no route, wrong method, body over client_max_size
            response = _json_error(exc.status, ErrorCode.HTTP, exc.reason)
        self._requests.inc(route=route, status=str(response.status))
        return response

    # --- bodies and signers --------------------------------------------------------------------------

    async def _body(self, request: web.Request, limit: int) -> bytes:
        if request.content_length is not None and request.content_length > limit:
            message = f"body of {request.content_length} bytes is over the {limit}-byte limit"
            raise Refused(ErrorCode.TOO_LARGE, message)
        body = await read_body(request.content, limit)
        if len(body) > limit:
            raise Refused(ErrorCode.TOO_LARGE, f"body is over the {limit}-byte limit")
        return body

    async def _signer(self, request: web.Request, body: bytes, role: str) -> str:
        """The signer of a request that holds `role` ("member" or "validator"), its nonce recorded only then."""
        now = time.time()
        self._rate_limit("address", request.remote or "?", now)
        try:
            checked = check_request(
                request.headers,
                self.service.domain,
                request.method,
                request.raw_path,
                body,
                pool_id=self.service.state.pool_id,
                host=request.host,  # the Host header: what the client addressed, which it signed
                now=now,
                max_skew=self.config.max_skew,
            )
        except RequestAuthError as exc:
            raise Refused(ErrorCode(exc.code.value), str(exc)) from None
        self._rate_limit("signer", checked.signer, now)
        await self.service.authorize(checked.signer, role)
        try:
            self.nonces.add(checked.signer, checked.nonce, now)
        except RequestAuthError as exc:
            raise Refused(ErrorCode(exc.code.value), str(exc)) from None
        return checked.signer

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
        body = await self._body(request, self.config.max_json_bytes)  # its content is not read: `{}` by convention
        node = await self._signer(request, body, "member")
        return _answer(await self.service.assign(node))

    async def _upload(self, request: web.Request) -> web.Response:
        work_key = routes.work_key_of(request.match_info["sha256"])
        if work_key is None:
            message = "the path must be /v1/rollouts/<64 lower-case hex digits of sha256>"
            raise Refused(ErrorCode.BAD_NAME, message)
        body = await self._body(request, self.config.max_upload_bytes)
        node = await self._signer(request, body, "member")
        upload = await self.service.upload(work_key, body, node)
        if upload.created:
            self._uploads.inc()
        return _answer(upload, 201 if upload.created else 200)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["sha256"]
        work_key = routes.work_key_of(name)
        if work_key is None:
            raise Refused(ErrorCode.NOT_FOUND, f"no rollout file {name}")
        return web.FileResponse(self.service.stored_file(work_key))

    async def _attest(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.config.max_json_bytes)
        signer = await self._signer(request, body, "validator")
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
