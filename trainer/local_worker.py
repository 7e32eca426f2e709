"""A local-mode worker: `python -m trainer.local_worker`, started by `prime-train run --local-workers N`.

It runs the worker's loop without a chain: ask the coordinator for a task, make sure it holds the weights of the
task's step (fetched through SHARDCAST from the trainer's origin, signature checked), generate the file with the
logic of `prime-node generate` (proofs included), upload it signed. The worker daemon of the network
(`prime-node start`) adds registration, stake and on-chain submission around the same loop. Its key is the
keystore `--keystore` names, decrypted with the password in PRIME_KEYSTORE_PASSWORD (set by the trainer).

It exits 0 on SIGTERM or SIGINT (after the file in progress), and when the coordinator has been unreachable for
`--patience` seconds (the trainer finished). It exits 1 after `--max-failures` failed files in a row (a policy it
cannot fetch or trust, a task it cannot generate), so that a broken setup stops the run instead of idling it,
and at once when its keystore does not open.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path

from eth_account.signers.local import LocalAccount

from ledger.accounts import PASSWORD_ENV_VAR, AccountError, load_account, resolve_password

log = logging.getLogger("trainer.local_worker")


async def run(args: argparse.Namespace, account: LocalAccount) -> int:
    # torch and the model code load here, after the keystore opened: a worker that cannot sign stops in a second
    from node.coordinator import CoordinatorClient, CoordinatorRefused, CoordinatorUnavailable, NoWorkYet
    from node.daemon.weights import Weights
    from node.generation.generate import generate_file
    from node.inference.torch_backend import TorchBackend
    from node.relay.client import new_session
    from node.relay.sources import SourcePool
    from node.relay.trust import TrustPolicy
    from node.signing import SigningDomain
    from node.tasks.sources import open_source
    from node.tasks.spec import load_task_spec

    domain = SigningDomain(args.chain_id, args.contract)
    spec = load_task_spec(args.task)
    source = open_source(spec)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # in the task's precision, as every worker of a pool generates (trusted here, but the files are the same kind)
    weights = Weights(
        work / "weights",
        SourcePool([args.origin]),
        TrustPolicy(domain, args.trainer, args.pool),
        dtype=spec.sampling.dtype,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    files = 0
    failures = 0  # in a row, of anything but an unreachable coordinator
    unreachable_since: float | None = None
    backend: TorchBackend | None = None  # rebuilt when a new policy is loaded
    async with new_session() as session:
        coordinator = CoordinatorClient(session, args.coordinator, account, domain, pool_id=args.pool)
        while not stop.is_set():
            try:
                job = await coordinator.request_task()
                started = time.perf_counter()
                loaded = await weights.hold(job.step)
                if backend is None or backend.model is not loaded.model:
                    backend = TorchBackend.from_loaded(loaded, max_batch_size=args.batch_size)
                with tempfile.TemporaryDirectory(dir=work) as tmp:
                    written = await asyncio.to_thread(
                        generate_file,
                        Path(tmp) / "rollouts.parquet",
                        job,
                        spec,
                        source,
                        loaded,
                        backend,
                        manifest_hash=weights.manifest_hash,
                    )
                    await coordinator.upload(written.work_key, written.path.read_bytes())
                files += 1
                failures = 0
                unreachable_since = None
                log.info(
                    "uploaded 0x%s (step %d, counter %d) in %.2f s",
                    written.work_key.hex()[:12], job.step, job.counter, time.perf_counter() - started,
                )  # fmt: skip
            except CoordinatorRefused as exc:
                log.error("%s", exc)
                return 1
            except NoWorkYet as exc:  # this step's share is done and the next step is slow to come: ask again
                unreachable_since = None
                await asyncio.sleep(min(exc.retry_after, 1.0))
            except (CoordinatorUnavailable, OSError) as exc:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > args.patience:
                    log.info("the coordinator has been unreachable for %.0f s; stopping (%s)", args.patience, exc)
                    break
                await asyncio.sleep(0.5)
            except Exception as exc:  # a fetch that failed (version pruned, origin restarting): ask again
                failures += 1
                if failures >= args.max_failures:
                    log.error("giving up after %d failures in a row; the last: %s", failures, exc)
                    return 1
                log.warning("retrying after: %s", exc)
                await asyncio.sleep(0.5)
    log.info("stopped after %d files", files)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.local_worker", description=__doc__)
    parser.add_argument("--coordinator", required=True, help="URL of the coordinator API")
    parser.add_argument("--origin", required=True, help="URL of the trainer's SHARDCAST origin")
    parser.add_argument("--trainer", required=True, help="address that signs the checkpoints")
    parser.add_argument("--pool", type=int, required=True)
    parser.add_argument("--chain-id", type=int, required=True)
    parser.add_argument("--contract", required=True, help="verifying contract of the signing domain")
    parser.add_argument(
        "--keystore", required=True, help=f"this worker's keystore (v3); its password comes from {PASSWORD_ENV_VAR}"
    )
    parser.add_argument("--task", required=True, help="task spec (TOML)")
    parser.add_argument("--work", required=True, help="folder for weights and files in progress")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--batch-size", type=int, default=128, help="sequences decoded together (128: a default file in one pass)"
    )
    parser.add_argument("--patience", type=float, default=10.0, help="seconds without a coordinator before exiting")
    parser.add_argument("--max-failures", type=int, default=20, help="failed files in a row before exiting 1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:  # the trainer passes the password in the environment, never on the command line
        account = load_account(Path(args.keystore), resolve_password(prompt=False))
    except AccountError as exc:
        log.error("%s", exc)
        return 1
    import torch

    torch.set_num_threads(args.threads)
    return asyncio.run(run(args, account))


if __name__ == "__main__":
    sys.exit(main())
