"""SHARDCAST: checkpoint distribution through relays (DESIGN section 9), and the relay package's exception tree.

Every error raised by `shardcast` derives from `RelayError`; the leaves carry the step, file and shard index a
person needs to find the offending bytes. The modules: `manifest` (what a checkpoint version is, pure),
`store` (versions on a relay's disk), `partial` (a version being downloaded, the client's or a mirroring relay's),
`fileio` (the Linux file I/O under both, and a relay's memory budget), `server` and `polls` (the HTTP side), `sources`
and `client` (the downloading side), `origin` and `mirror` (who fills a store).
"""

from __future__ import annotations

from core.errors import NodeError


class RelayError(NodeError):
    """Base of every error raised by the relay package."""


class ManifestError(RelayError):
    """A manifest (or the checkpoint directory it is built from) is malformed, unsafe or over a limit."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad manifest: {reason}")
        self.reason = reason


class ShardHashMismatch(RelayError):
    """A shard's bytes do not hash to the manifest's value for it (BLAKE3, or sha256 in format 1)."""

    def __init__(self, file: str, index: int, expected: str, actual: str) -> None:
        super().__init__(f"shard {file}[{index}] hash mismatch: expected {expected}, got {actual}")
        self.file, self.index, self.expected, self.actual = file, index, expected, actual


class FileHashMismatch(RelayError):
    """A whole file does not hash (or size) to the manifest's value although its shards did, or its source did not."""

    def __init__(self, file: str, expected: str, actual: str) -> None:
        super().__init__(f"file {file} hash mismatch: expected {expected}, got {actual}")
        self.file, self.expected, self.actual = file, expected, actual


class UnknownShard(RelayError):
    """A (file, index) that the manifest does not list."""

    def __init__(self, file: str, index: int) -> None:
        super().__init__(f"no shard {file}[{index}] in the manifest")
        self.file, self.index = file, index


class VersionNotFound(RelayError):
    """The store holds no version with this step."""

    def __init__(self, step: int) -> None:
        super().__init__(f"no version {step} in the store")
        self.step = step


class VersionExists(RelayError):
    """The store already holds this step with a different manifest."""

    def __init__(self, step: int) -> None:
        super().__init__(f"version {step} already stored with a different manifest")
        self.step = step


class IncompleteCheckpoint(RelayError):
    """`finish()` was called while shards are still missing."""

    def __init__(self, missing: list[tuple[str, int]]) -> None:
        shown = ", ".join(f"{f}[{i}]" for f, i in missing[:5])
        super().__init__(f"{len(missing)} shards missing ({shown}{', ...' if len(missing) > 5 else ''})")
        self.missing = missing


class TargetExists(RelayError):
    """The final checkpoint path already exists; it is never overwritten."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} already exists; remove it or choose another --out")
        self.path = path


class ShardPending(RelayError):
    """A shard of a version this relay is still mirroring has not arrived yet; ask again shortly."""

    def __init__(self, step: int, file: str, index: int) -> None:
        super().__init__(f"shard {file}[{index}] of version {step} is not mirrored yet")
        self.step, self.file, self.index = step, file, index


class UntrustedManifest(RelayError):
    """A manifest whose signature does not recover to the expected trainer, or that is for another pool or step."""

    def __init__(self, step: int, reason: str, source: str = "") -> None:
        where = f" from {source}" if source else ""
        super().__init__(f"manifest of step {step}{where} refused: {reason}")
        self.step, self.reason, self.source = step, reason, source


class LongPollRefused(RelayError):
    """A server holds as many long-polls as it may (for this client address, or in all); `limit` says which."""

    def __init__(self, client: str, limit: str, reason: str) -> None:
        super().__init__(f"long-poll from {client} refused: {reason}")
        self.client, self.limit, self.reason = client, limit, reason


class SourceError(RelayError):
    """A source (origin or relay) failed a request: unreachable, an HTTP error, or bytes that did not verify."""

    def __init__(self, source: str, reason: str, *, busy_for: float | None = None) -> None:
        super().__init__(f"{source}: {reason}")
        self.source, self.reason = source, reason
        self.busy_for = busy_for  # set when the source asked to be retried later (HTTP 429/503): not a failure


class DownloadFailed(RelayError):
    """No source could deliver the checkpoint; `errors` says what each source did."""

    def __init__(self, step: int | None, errors: list[str]) -> None:
        shown = "; ".join(errors[-5:]) or "no source has it"
        what = "the newest version" if step is None else f"step {step}"
        super().__init__(f"could not download {what}: {shown}")
        self.step, self.errors = step, errors
