"""The pool spec: what every node of a pool needs to know besides the chain, at the URI the pool's `specURI` names.

ComputePool holds the trainer's address, the model hash and the economics; the spec holds the rest, as TOML:

    coordinator = "https://pool.example.org"          # the trainer's coordinator API
    checkpoints = ["https://relay-1.example.org"]     # SHARDCAST sources: the origin and relays, tried together
    task = "tasks/default.toml"                       # the task spec; relative to the spec's own location
    async_level = 2                                   # files from steps >= current - async_level count
    bootstrap = []                                    # libp2p multiaddrs of bootstrap peers

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

from node.errors import NodeError
from node.tasks.errors import TaskSpecError
from node.tasks.fields import Fields
from node.tasks.spec import TaskSpec, load_task_spec

MAX_SPEC_BYTES = 1 << 20
FETCH_TIMEOUT = 10.0
DEFAULT_CACHE = Path.home() / ".cache" / "prime-node" / "pool-specs"


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
        raise PoolSpecError("the pool has no spec URI; pass --coordinator, --checkpoints and --task instead")
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
        async_level = fields.integer("async_level", 2, minimum=0, maximum=1 << 16)
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
    spec = PoolSpec(uri, coordinator, checkpoints, task_path, async_level, tuple(bootstrap_raw))
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
    async_level: int
    bootstrap: tuple[str, ...] = ()  # libp2p multiaddrs; empty when the spec was not read


def resolve_endpoints(
    spec_uri: str,
    *,
    coordinator: str | None = None,
    checkpoints: Sequence[str] | None = None,
    task: Path | None = None,
    want_bootstrap: bool = False,
    cache: Path = DEFAULT_CACHE,
) -> PoolEndpoints:
    """The flags' values, and what they leave open from the pool spec at `spec_uri` (read only when needed).

    With `want_bootstrap` (a daemon that runs a p2p host) the spec is also read for its bootstrap peers when the
    flags leave nothing else open, unless the pool has no spec URI. Every URL is checked (http or https, with a
    host); a bad flag raises PoolSpecError naming it.
    """
    async_level = 2
    bootstrap: tuple[str, ...] = ()
    if coordinator is None or not checkpoints or task is None or (want_bootstrap and spec_uri.strip()):
        spec = load_pool_spec(spec_uri, cache=cache)
        coordinator = coordinator or spec.coordinator
        checkpoints = checkpoints or spec.checkpoints
        task = task or spec.task_path
        async_level = spec.async_level
        bootstrap = spec.bootstrap
    return PoolEndpoints(
        coordinator=_url(coordinator, "--coordinator"),
        checkpoints=tuple(_url(url, "--checkpoints") for url in checkpoints),
        task_path=Path(task),
        async_level=async_level,
        bootstrap=bootstrap,
    )
