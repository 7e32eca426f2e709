"""A node's client of the trainer's coordinator API (DESIGN section 8): signed requests, typed answers.

Every signed request carries the EIP-712 `Request` headers of `node.signing.sign_request`, over the exact path
and body sent. A 4xx answer raises `CoordinatorRefused` with the server's error code and message; a connection
failure, a 5xx or a 429 (rate limited, busy, over the upload quota: `CoordinatorBusy`) raises
`CoordinatorUnavailable`, which a caller may retry.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

import aiohttp
from eth_account.signers.local import LocalAccount

from node.bodies import read_body
from node.errors import NodeError
from node.generation.plan import Job
from node.safejson import loads_bounded
from node.signing import Attestation, SignatureError, SigningDomain, recover, sign, sign_request

_MAX_ANSWER = 64 * 1024
_MAX_DEPTH = 4  # the API's answers nest at most 3 deep (/v1/steps)


class CoordinatorError(NodeError):
    """A request to the coordinator failed."""


class CoordinatorUnavailable(CoordinatorError):
    """The coordinator could not be reached or answered 5xx; worth retrying."""


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


@dataclass(frozen=True)
class PublishedStep:
    """One entry of `GET /v1/steps`: `step` became the pool's current policy at `at` (unix seconds)."""

    step: int
    at: float


@dataclass(frozen=True)
class Verdict:
    """A validator's attestation on a file, its signature checked by the client."""

    validator: str
    accepted: bool
    reason: int


@dataclass(frozen=True)
class Upload:
    work_key: bytes
    created: bool  # False: the coordinator already held these exact bytes
    receipt: bytes | None = None  # the trainer's signature over UploadReceipt(pool, work key, node); None: none sent


class CoordinatorLostFile(CoordinatorError):
    """The coordinator acknowledged the file once and no longer has it (410): its loss, never the worker's fault."""


class CoordinatorClient:
    """A client of one pool's coordinator at `url`. Signed requests name the pool and the URL's host, so they are
    good at that coordinator only; without `pool_id` the client asks the coordinator (`GET /v1/pool`) once."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        account: LocalAccount,
        domain: SigningDomain,
        *,
        pool_id: int | None = None,
    ) -> None:
        self.session, self.url, self.account, self.domain = session, url.rstrip("/"), account, domain
        self.pool_id = pool_id
        self.host = urllib.parse.urlsplit(self.url).netloc

    async def _call(self, method: str, path: str, body: bytes = b"", *, signed: bool) -> dict[str, Any]:
        headers: dict[str, str] = {}
        if signed:
            if self.pool_id is None:
                self.pool_id = await self._pool_id()
            headers = sign_request(self.account, self.domain, method, path, body, pool_id=self.pool_id, host=self.host)
        try:
            async with self.session.request(method, self.url + path, data=body or None, headers=headers) as response:
                raw = await read_body(response.content, _MAX_ANSWER)
                status = response.status
                retry_after = response.headers.get("Retry-After", "")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise CoordinatorUnavailable(f"{method} {self.url}{path}: {exc}") from exc
        if len(raw) > _MAX_ANSWER:
            raise CoordinatorUnavailable(f"{method} {path}: answer over {_MAX_ANSWER} bytes")
        try:
            answer = loads_bounded(raw, _MAX_DEPTH)
        except ValueError:
            answer = None
        if status == 503 and isinstance(answer, dict) and answer.get("error") == "no_work":
            raise NoWorkYet(str(answer.get("message", ""))[:300], _retry_after(retry_after, default=1.0))
        if status == 429:
            error = answer if isinstance(answer, dict) else {}
            code, message = str(error.get("error", "http"))[:40], str(error.get("message", ""))[:300]
            raise CoordinatorBusy(code, message, _retry_after(retry_after, default=1.0))
        if status >= 500:
            raise CoordinatorUnavailable(f"{method} {path}: HTTP {status}")
        if status >= 400:
            error = answer if isinstance(answer, dict) else {}
            raise CoordinatorRefused(status, str(error.get("error", "http")), str(error.get("message", raw[:200])))
        if not isinstance(answer, dict):
            raise CoordinatorUnavailable(f"{method} {path}: the answer is not a JSON object")
        return answer

    async def _pool_id(self) -> int:
        answer = await self._call("GET", "/v1/pool", signed=False)
        pool_id = answer.get("pool_id")
        if not isinstance(pool_id, int) or isinstance(pool_id, bool) or pool_id < 0:
            raise CoordinatorUnavailable(f"/v1/pool answered {answer!r}")
        return pool_id

    async def step(self) -> int:
        answer = await self._call("GET", "/v1/step", signed=False)
        step = answer.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise CoordinatorUnavailable(f"/v1/step answered {answer!r}")
        return step

    async def steps(self) -> list[PublishedStep]:
        """The recent steps and when each became current, oldest first (a bounded history)."""
        answer = await self._call("GET", "/v1/steps", signed=False)
        try:
            steps = [PublishedStep(_count(e["step"]), _seconds(e["at"])) for e in answer["steps"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise CoordinatorUnavailable(f"/v1/steps answered an invalid history: {exc}") from None
        return steps

    async def attestations(self, work_key: bytes, pool_id: int) -> list[Verdict]:
        """The verdicts validators posted on a file; one whose signature does not match its validator is dropped.

        Checking the signatures means a coordinator cannot show a worker an acceptance nobody signed; whether the
        signer is one of the pool's validators is for the caller to ask the chain.
        """
        answer = await self._call("GET", f"/v1/rollouts/{work_key.hex()}/attestations", signed=False)
        verdicts = []
        try:
            for entry in answer["attestations"]:
                accepted, reason = entry["accepted"], entry["reason"]
                message = Attestation(pool_id, work_key, accepted, reason)
                signature = bytes.fromhex(str(entry["signature"]).removeprefix("0x"))
                try:
                    signer = recover(message, signature, self.domain)
                except SignatureError:
                    continue
                if signer == entry["validator"]:
                    verdicts.append(Verdict(signer, bool(accepted), int(reason)))
        except (KeyError, TypeError, ValueError) as exc:
            raise CoordinatorUnavailable(f"/v1/rollouts/.../attestations answered an invalid list: {exc}") from None
        return verdicts

    async def holds(self, work_key: bytes, *, timeout: float = 30.0) -> bool:
        """Whether the coordinator serves the file now (HEAD): False when it never had it (404) or lost it (410)."""
        url = f"{self.url}/v1/rollouts/{work_key.hex()}"
        try:
            async with self.session.head(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                if response.status in (404, 410):
                    return False
                if response.status >= 500:
                    raise CoordinatorUnavailable(f"HEAD {url}: HTTP {response.status}")
                if response.status != 200:
                    raise CoordinatorRefused(response.status, "http", f"HEAD {url} answered HTTP {response.status}")
                return True
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise CoordinatorUnavailable(f"HEAD {url}: {exc or type(exc).__name__}") from exc

    async def download(self, work_key: bytes, max_bytes: int, *, timeout: float = 60.0) -> bytes | None:
        """An uploaded file's bytes, None when the coordinator has no such file (404).

        Reads at most `max_bytes + 1` bytes: enough for a size check to refuse a larger file without holding it all.
        """
        url = f"{self.url}/v1/rollouts/{work_key.hex()}"
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                if response.status == 404:
                    return None
                if response.status == 410:
                    raise CoordinatorLostFile(f"GET {url}: the coordinator acknowledged this file and lost it")
                if response.status >= 500:
                    raise CoordinatorUnavailable(f"GET {url}: HTTP {response.status}")
                if response.status != 200:
                    raise CoordinatorRefused(response.status, "http", f"GET {url} answered HTTP {response.status}")
                return await read_body(response.content, max_bytes)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise CoordinatorUnavailable(f"GET {url}: {exc or type(exc).__name__}") from exc

    async def request_task(self) -> Job:
        """The next assignment for this node; the coordinator chooses the step and the counter."""
        answer = await self._call("POST", "/v1/tasks", b"{}", signed=True)
        try:
            signature = answer.get("signature")
            job = Job(
                pool_id=int(answer["pool_id"]),
                node=str(answer["node"]),
                step=int(answer["step"]),
                counter=int(answer["counter"]),
                prompts=int(answer["prompts"]),
                group_size=int(answer["group_size"]),
                signature=None if signature is None else _signature_bytes(signature),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CoordinatorUnavailable(f"/v1/tasks answered an invalid task {answer!r}: {exc}") from None
        if job.node != self.account.address:
            raise CoordinatorUnavailable(f"/v1/tasks answered a task for {job.node}, not {self.account.address}")
        return job

    async def upload(self, work_key: bytes, data: bytes) -> Upload:
        """Stores the file; the receipt comes back unchecked (the caller knows the trainer to check it against)."""
        answer = await self._call("PUT", f"/v1/rollouts/{work_key.hex()}", data, signed=True)
        receipt = answer.get("receipt")
        try:
            signature = bytes.fromhex(receipt.removeprefix("0x")) if isinstance(receipt, str) else None
        except ValueError:
            signature = None
        return Upload(work_key, bool(answer.get("created", False)), signature)

    async def attest(self, attestation: Attestation) -> None:
        """Posts a validator's signed verdict (the attestation is signed by this client's account)."""
        signature = sign(attestation, self.account, self.domain)
        body = json.dumps(
            {
                "work_key": "0x" + attestation.work_key.hex(),
                "accepted": attestation.accepted,
                "reason": attestation.reason,
                "signature": "0x" + signature.hex(),
            }
        ).encode()
        await self._call("POST", "/v1/attestations", body, signed=True)


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not a step: {value!r:.40}")
    return value


def _seconds(value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ValueError(f"not a unix time: {value!r:.40}")
    return float(value)


def _retry_after(text: str, *, default: float) -> float:
    """A Retry-After in seconds, bounded to [0.1, 30] whatever a coordinator sends."""
    try:
        value = float(text)
    except ValueError:
        return default
    return min(30.0, max(0.1, value)) if value == value else default


def _signature_bytes(value: object) -> bytes:
    """A 65-byte signature from its 0x-hex form; ValueError for anything else."""
    if not isinstance(value, str) or not value.startswith("0x") or len(value) != 2 + 130:
        raise ValueError(f"signature must be 0x and 130 hex digits, got {str(value)[:80]!r}")
    return bytes.fromhex(value[2:])
