"""The pool spec: what every node of a pool needs to know besides the chain, at the URI the pool's `specURI` names.

ComputePool holds the trainer's address, the model hash and the economics; the spec holds the rest, as TOML:

    coordinator = "https://pool.example.org"          # the trainer's coordinator API
    checkpoints = ["https://relay-1.example.org"]     # SHARDCAST sources: the origin and relays, tried together
    task = "tasks/default.toml"                       # the task spec; relative to the spec's own location
    async_level = 2                                   # files from steps >= current - async_level count
    max_file_bytes = 67108864                         # larger files are refused unread (reason 2)
    prompts_per_task = 8                              # the group shape of an assignment: prompts ...
    group_size = 8                                    # ... and samples per prompt
    replication = 1                                   # validators that check each work key (validator.sharing)
    assignment_lifetime = 10800                       # seconds from an assignment's issue to its file on chain
    clock_slack = 300                                 # seconds the pool's clocks may disagree, either way
    bootstrap = []                                    # libp2p multiaddrs of bootstrap peers

The keys after `task` are optional (the defaults are `protocol.terms`'s; `assignment_lifetime`'s follows `async_level`).
Every role reads the spec's terms whenever the pool has a spec URI (`protocol.terms.PoolTerms`); flags only say where
the pool's parts are.

The URI is a local path, a `file://` URL, or an `http(s)://` URL. A remote spec and its task are downloaded
(each at most 1 MiB) into a cache folder named by their sha256, so every node reads the bytes the URI served.
A remote task spec must be self-contained: one that names a local file (a JSONL source, a problem list) is
refused, because a node cannot fetch it.
"""

from __future__ import annotations

import hashlib
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import Settings, setting
from core.errors import NodeError
from protocol.tasks.errors import TaskSpecError
from protocol.tasks.fields import Fields
from protocol.tasks.spec import TaskSpec, load_task_spec, spec_hash
from protocol.terms import (
    DEFAULT_ASYNC_LEVEL,
    DEFAULT_CLOCK_SLACK,
    DEFAULT_GROUP_SIZE,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_PROMPTS_PER_TASK,
    DEFAULT_REPLICATION,
    MAX_ASSIGNMENT_LIFETIME,
    MAX_ASYNC_LEVEL,
    MAX_CLOCK_SLACK,
    MAX_FILE_BYTES,
    MAX_GROUP_SIZE,
    MAX_PROMPTS_PER_TASK,
    MAX_REPLICATION,
    MIN_FILE_BYTES,
    MIN_GROUP_SIZE,
    PoolTerms,
    TermsMismatch,
    assignment_timing,
)

if TYPE_CHECKING:
    from ledger.types import PoolInfo

MAX_SPEC_BYTES = 1 << 20
FETCH_TIMEOUT = 10.0
DEFAULT_CACHE = Path.home() / ".cache" / "prime-node" / "pool-specs"
NO_SPEC = "the pool has no spec URI; pass --coordinator, --checkpoints and --task instead"


class PoolSpecError(NodeError):
    """The pool spec cannot be read or is invalid; the message names the URI and the field."""


@dataclass(frozen=True)
class PoolSpec:
    uri: str
    coordinator: str
    checkpoints: tuple[str, ...]
    task_path: Path  # local: the file itself, remote: its cached copy
    async_level: int
    bootstrap: tuple[str, ...]
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    prompts_per_task: int = DEFAULT_PROMPTS_PER_TASK
    group_size: int = DEFAULT_GROUP_SIZE
    replication: int = DEFAULT_REPLICATION
    assignment_lifetime: int | None = None  # None: protocol.terms.default_assignment_lifetime(async_level)
    clock_slack: int = DEFAULT_CLOCK_SLACK

    def task(self) -> TaskSpec:
        try:
            return load_task_spec(self.task_path)
        except TaskSpecError as exc:
            raise PoolSpecError(f"pool spec {self.uri}: its task: {exc}") from None


def _http_url(text: str) -> bool:
    return urllib.parse.urlsplit(text).scheme in ("http", "https")


def _url(value: object, where: str) -> str:
    if not isinstance(value, str) or not _http_url(value) or not urllib.parse.urlsplit(value).netloc:
        raise PoolSpecError(f"{where}: must be an http(s) URL, got {value!r}")
    return value.rstrip("/")


def _checked_url(uri: str, key: str, value: object) -> str:
    return _url(value, f"pool spec {uri}: {key}")


def _fetch(url: str, cache: Path) -> Path:
    """The bytes at `url`, stored in `cache` under their sha256; raises PoolSpecError on any failure."""
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as response:
            data = response.read(MAX_SPEC_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise PoolSpecError(f"cannot fetch {url}: {exc}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise PoolSpecError(f"{url} is larger than {MAX_SPEC_BYTES} bytes; a spec is a small TOML file")
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{hashlib.sha256(data).hexdigest()}.toml"
    if not path.exists():
        staging = path.with_suffix(".partial")
        staging.write_bytes(data)
        staging.replace(path)
    return path


def _local_path(uri: str) -> Path:
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme == "file":
        return Path(urllib.parse.unquote(parts.path))
    if parts.scheme and len(parts.scheme) > 1:  # a one-letter scheme is a Windows drive
        raise PoolSpecError(
            f"pool spec URI {uri!r}: scheme {parts.scheme!r} is not supported (path, file://, http(s)://)"
        )
    return Path(uri)


def load_pool_spec(uri: str, *, cache: Path = DEFAULT_CACHE) -> PoolSpec:
    """Reads and validates the pool spec at `uri` (see the module docstring)."""
    if not uri.strip():
        raise PoolSpecError(NO_SPEC)
    remote = _http_url(uri)
    path = _fetch(uri, cache) if remote else _local_path(uri)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PoolSpecError(f"pool spec {uri}: not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PoolSpecError(f"pool spec {uri}: not readable TOML ({exc})") from None
    fields = Fields(path, "", raw)
    try:
        coordinator = _checked_url(uri, "coordinator", fields.raw("coordinator"))
        checkpoints_raw = fields.raw("checkpoints")
        if not isinstance(checkpoints_raw, list) or not checkpoints_raw:
            raise PoolSpecError(f"pool spec {uri}: checkpoints: must be a non-empty list of URLs")
        checkpoints = tuple(_checked_url(uri, "checkpoints", c) for c in checkpoints_raw)
        task = fields.text("task", nonempty=True)
        async_level = fields.integer("async_level", DEFAULT_ASYNC_LEVEL, minimum=0, maximum=MAX_ASYNC_LEVEL)
        max_file_bytes = fields.integer(
            "max_file_bytes", DEFAULT_MAX_FILE_BYTES, minimum=MIN_FILE_BYTES, maximum=MAX_FILE_BYTES
        )
        prompts = fields.integer("prompts_per_task", DEFAULT_PROMPTS_PER_TASK, minimum=1, maximum=MAX_PROMPTS_PER_TASK)
        group_size = fields.integer("group_size", DEFAULT_GROUP_SIZE, minimum=MIN_GROUP_SIZE, maximum=MAX_GROUP_SIZE)
        replication = fields.integer("replication", DEFAULT_REPLICATION, minimum=1, maximum=MAX_REPLICATION)
        lifetime = (
            fields.integer("assignment_lifetime", minimum=1, maximum=MAX_ASSIGNMENT_LIFETIME)
            if "assignment_lifetime" in raw
            else None
        )
        clock_slack = fields.integer("clock_slack", DEFAULT_CLOCK_SLACK, minimum=0, maximum=MAX_CLOCK_SLACK)
        try:
            assignment_timing(async_level, lifetime, clock_slack)
        except ValueError as exc:
            fields.fail("assignment_lifetime", str(exc))
        bootstrap_raw = fields.raw("bootstrap", [])
        if not isinstance(bootstrap_raw, list) or not all(isinstance(b, str) and b for b in bootstrap_raw):
            raise PoolSpecError(f"pool spec {uri}: bootstrap: must be a list of multiaddr strings")
        fields.done()
    except TaskSpecError as exc:  # Fields names the file and the key
        raise PoolSpecError(f"pool spec {uri}: {exc.field}: {exc.problem}") from None
    if remote or _http_url(task):
        task_path = _fetch(urllib.parse.urljoin(uri, task) if remote else task, cache)
    else:
        task_path = (path.parent / task).resolve()
    spec = PoolSpec(
        uri, coordinator, checkpoints, task_path, async_level, tuple(bootstrap_raw), max_file_bytes, prompts,
        group_size, replication, lifetime, clock_slack,
    )  # fmt: skip
    loaded = spec.task()
    if (remote or _http_url(task)) and _names_local_files(loaded):
        raise PoolSpecError(f"pool spec {uri}: its task {task} names local files a node cannot fetch")
    return spec


def _names_local_files(task: TaskSpec) -> bool:
    return task.problem_list is not None or getattr(task.source, "path", None) is not None


@dataclass(frozen=True)
class PoolEndpoints:
    """Where a daemon finds the pool's parts: its flags where given, the pool spec for the rest."""

    coordinator: str
    checkpoints: tuple[str, ...]
    task_path: Path
    bootstrap: tuple[str, ...] = ()  # libp2p multiaddrs; empty when the pool has no spec


@dataclass(frozen=True)
class Pool:
    """A pool as a daemon joins it: its terms (binding) and where its parts are (flags may move those)."""

    terms: PoolTerms
    endpoints: PoolEndpoints


def read_terms(info: PoolInfo, *, cache: Path = DEFAULT_CACHE) -> tuple[PoolTerms, PoolSpec | None]:
    """The terms of the pool `info` describes, and its spec (None when it has no spec URI; one that cannot be read
    raises PoolSpecError)."""
    spec = load_pool_spec(info.config.spec_uri, cache=cache) if info.config.spec_uri.strip() else None
    return pool_terms(info, spec), spec


def pool_terms(info: PoolInfo, spec: PoolSpec | None) -> PoolTerms:
    """The terms of the pool `info` describes, with `spec` its loaded pool spec (None: the pool has none)."""
    if spec is None:
        return PoolTerms.of_chain(info)
    return PoolTerms.of_chain(
        info,
        spec_uri=spec.uri,
        async_level=spec.async_level,
        max_file_bytes=spec.max_file_bytes,
        prompts_per_task=spec.prompts_per_task,
        group_size=spec.group_size,
        replication=spec.replication,
        assignment_lifetime=spec.assignment_lifetime,
        clock_slack=spec.clock_slack,
        task_path=spec.task_path,
        task_hash=spec_hash(spec.task()),
    )


def resolve_pool(
    info: PoolInfo,
    *,
    coordinator: str | None = None,
    checkpoints: Sequence[str] | None = None,
    task: Path | None = None,
    cache: Path = DEFAULT_CACHE,
) -> Pool:
    """The pool `info` describes (its chain record): its terms, from the chain and the pool spec at its specURI,
    and its endpoints, the flags' values where given and the spec's for the rest.

    The spec is read whenever the pool has a spec URI, even when the flags name every part: its terms bind every
    role, and a spec that cannot be read raises PoolSpecError rather than leaving them at the defaults. A `task`
    flag must be the pool's task (the same canonical hash; assignments sign it), or TermsMismatch names it. Every
    URL is checked (http or https, with a host); a bad flag raises PoolSpecError naming it.
    """
    terms, spec = read_terms(info, cache=cache)
    if spec is None and (coordinator is None or not checkpoints or task is None):
        raise PoolSpecError(NO_SPEC)
    if task is not None and terms.task_hash is not None:
        try:
            own = spec_hash(load_task_spec(task))
        except TaskSpecError as exc:
            raise PoolSpecError(f"--task: {exc}") from None
        if own != terms.task_hash:
            pools = f"{terms.task_path} (task hash 0x{terms.task_hash.hex()[:12]})"
            raise TermsMismatch("--task", f"{task} (task hash 0x{own.hex()[:12]})", pools, terms.source)
    endpoints = PoolEndpoints(
        coordinator=_url(coordinator or (spec.coordinator if spec else ""), "--coordinator"),
        checkpoints=tuple(_url(url, "--checkpoints") for url in (checkpoints or (spec.checkpoints if spec else ()))),
        task_path=Path(task) if task is not None else spec.task_path if spec else Path(),
        bootstrap=spec.bootstrap if spec else (),
    )
    return Pool(terms, endpoints)


def state_setting(doc: str) -> Any:
    """A daemon's `state` field: its folder (`--state`; relative in a config file to the file's folder); `doc` says
    what the folder holds and where it is when not set."""
    return setting(doc, default=None, flag="--state", relative=True)


@dataclass(frozen=True)
class DaemonSettings(Settings):
    """What every pool daemon (worker, validator) declares first: its state folder, which each role re-declares with
    `state_setting` to say what it holds, and where the pool's parts are, overriding the pool spec's."""

    state: Path | None = state_setting("the daemon's folder; None: one in ~/.local/share/prime-node/pool-N/")
    coordinator: str | None = setting(
        "the coordinator's URL; None: the pool spec's", default=None, flag="--coordinator"
    )
    checkpoints: tuple[str, ...] = setting(
        "checkpoint sources (URLs); empty: the pool spec's", default=(), flag="--checkpoints"
    )
    task: Path | None = setting(
        "the task spec (TOML); None: the pool spec's", default=None, flag="--task", relative=True
    )

    def resolve(self, info: PoolInfo) -> Pool:
        """The pool `info` describes, with its parts where these settings name them (`resolve_pool`)."""
        return resolve_pool(
            info, coordinator=self.coordinator, checkpoints=list(self.checkpoints) or None, task=self.task
        )

    def state_dir(self, pool_id: int, name: str) -> Path:
        """`state`, or else folder `name` of pool `pool_id` in ~/.local/share/prime-node."""
        return self.state or Path.home() / ".local" / "share" / "prime-node" / f"pool-{pool_id}" / name
