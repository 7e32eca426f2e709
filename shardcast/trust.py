"""Who may publish a checkpoint: the pool's trainer signs `Checkpoint(poolId, step, manifestHash)`.

Relays are untrusted: they pass the signature along with the manifest, and every client (and every relay
configured with the trainer's address) checks it before downloading a byte of the version.
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_account.signers.local import LocalAccount

from protocol.signing import Checkpoint, SignatureError, SigningDomain, recover, sign
from shardcast import UntrustedManifest
from shardcast.manifest import Manifest, manifest_hash


def checkpoint_message(manifest: Manifest) -> Checkpoint:
    return Checkpoint(pool_id=manifest.pool_id, step=manifest.step, manifest_hash=manifest_hash(manifest))


def sign_manifest(manifest: Manifest, account: LocalAccount, domain: SigningDomain) -> bytes:
    return sign(checkpoint_message(manifest), account, domain)


@dataclass(frozen=True)
class TrustPolicy:
    """What a downloaded manifest must satisfy: signed by `trainer` under `domain`, for `pool_id` if given."""

    domain: SigningDomain
    trainer: str  # checksummed address
    pool_id: int | None = None

    def check(self, manifest: Manifest, signature: bytes, *, step: int | None = None, source: str = "") -> None:
        """Raise `UntrustedManifest` unless the manifest is the trainer's, for the expected pool and step."""
        if step is not None and manifest.step != step:
            raise UntrustedManifest(step, f"it is the manifest of step {manifest.step}", source)
        if self.pool_id is not None and manifest.pool_id != self.pool_id:
            raise UntrustedManifest(manifest.step, f"it is for pool {manifest.pool_id}, not {self.pool_id}", source)
        try:
            signer = recover(checkpoint_message(manifest), signature, self.domain)
        except SignatureError as exc:
            raise UntrustedManifest(manifest.step, str(exc), source) from None
        if signer != self.trainer:
            raise UntrustedManifest(manifest.step, f"signed by {signer}, not by the trainer {self.trainer}", source)
