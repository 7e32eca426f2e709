"""`prime-train run`: the coordinator API, the SHARDCAST origin and the step loop in one process; under torchrun
the same on rank 0 (`run_training`), with every other rank training beside it (`follow_training`, `trainer.ranks`).

Network mode ([pool] in trainer.toml): members come from ComputePool, and a file is trained on once
`min_attestations` validators accepted it and none rejected it. Local mode (`--local-workers N`): no chain; the
trainer makes a key for itself and for each of N worker processes (the worker daemon in local mode,
`node.daemon.local`), each in an encrypted
keystore under `keys/`, admits exactly those workers, and trusts their uploads. Both sign checkpoints and
requests under an EIP-712 domain: the pool's ComputePool in network mode, `LOCAL_DOMAIN` in local mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount

from core import trace
from ledger.accounts import PASSWORD_ENV_VAR, create_keystore, list_keystores, load_account, read_keystore
from protocol.signing import SigningDomain
from protocol.tasks.sources import TaskSource, open_source
from protocol.tasks.spec import TaskSpec, load_task_spec
from trainer.config import RunConfig, TrainerConfigError
from trainer.errors import TrainerError
from trainer.inbox import RolloutInbox
from trainer.learner import World
from trainer.loop import RunPaths, Selection, TrainingLoop
from trainer.memory import TrainingThread
from trainer.precision import resolve_precision
from trainer.ranks import STOP_SIGNALS, Control, Decision, follow, resume_loop, save_checkpoint, train
from trainer.roles import StaticRoles
from trainer.services import Network, Services, open_services
from trainer.sharded import open_loop
from trainer.verdicts import VerdictStore

log = logging.getLogger(__name__)

# local mode has no chain: anvil's chain id and no verifying contract; nothing signed here is valid on a chain
LOCAL_DOMAIN = SigningDomain(31337, "0x0000000000000000000000000000000000000000")
LOCAL_POOL_ID = 0


def _stored(inbox: RolloutInbox, keys: AbstractSet[bytes]) -> list[Path]:
    """The files of `keys` still on disk (one removed by hand is skipped, not read and refused)."""
    return [inbox.path(key) for key in keys if inbox.has(key)]


class EveryUpload:
    """Every upload (local mode: the trainer trusts its own workers)."""

    def __init__(self) -> None:
        self._seen = 0  # arrivals of the inbox taken into `_waiting`
        self._waiting: set[bytes] = set()

    def __call__(self, inbox: RolloutInbox, verdicts: VerdictStore, consumed: AbstractSet[bytes]) -> list[Path]:
        arrived = inbox.arrivals(self._seen)
        self._seen += len(arrived)
        self._waiting.update(arrived)
        self._waiting = {key for key in self._waiting if key not in consumed}
        return _stored(inbox, self._waiting)


class AttestedUploads:
    """Uploads accepted by at least `min_attestations` distinct validators and rejected by none (network mode).

    The verdicts come from the coordinator's `VerdictStore`, in this process: each call takes only the verdicts
    recorded since the last one and asks the store about their files, so a look does not grow with the run.
    """

    def __init__(self, min_attestations: int) -> None:
        self.min_attestations = min_attestations
        self._seen = 0  # verdicts of the store taken in
        self._ready: set[bytes] = set()  # accepted often enough, never rejected, and not consumed when last asked

    def __call__(self, inbox: RolloutInbox, verdicts: VerdictStore, consumed: AbstractSet[bytes]) -> list[Path]:
        changed = verdicts.changed(self._seen)
        self._seen += len(changed)
        for key in set(changed):
            if verdicts.trainable(key, self.min_attestations):
                self._ready.add(key)
            else:
                self._ready.discard(key)
        self._ready = {key for key in self._ready if key not in consumed}
        return _stored(inbox, self._ready)


TRAINER_KEY = "trainer"  # the label of the trainer's keystore; worker i's is "worker-<i>"
# Keystores encrypted at once: scrypt at eth-account's cost (n = 2**18) takes about 0.5 s and 256 MiB each.
MAX_PARALLEL_ENCRYPTIONS = 4


class LocalKeyError(TrainerError):
    """The `keys/` folder of a local run holds something that does not fit: a broken plaintext key, two keystores
    for one role, or a keystore and a plaintext key that disagree. Nothing is deleted when this is raised."""


@dataclass(frozen=True)
class LocalWorkerKeys:
    """The keystores of local mode's workers and the password that opens them: each worker gets its path on the
    command line and the password in its environment (PRIME_KEYSTORE_PASSWORD), never on the command line."""

    paths: tuple[Path, ...]
    password: str = field(repr=False)


def local_key_labels(workers: int) -> list[str]:
    return [TRAINER_KEY, *(f"worker-{i}" for i in range(workers))]


def missing_local_keystores(run_dir: Path, workers: int) -> list[str]:
    """The roles of a local run with no keystore yet (a plaintext key of an older run counts as missing): if any,
    the password is being chosen now, so the command line asks for it twice."""
    found = _keystores_by_label(run_dir / "keys", local_key_labels(workers))
    return [label for label in local_key_labels(workers) if label not in found]


def local_network(run_dir: Path, workers: int, password: str) -> tuple[Network, LocalWorkerKeys]:
    """Local mode's keys, kept in `<run_dir>/keys/<role>--<address>.json` (v3 keystores, scrypt, mode 0600), so that
    a restart keeps every identity. Missing keystores are made (in parallel: scrypt is slow by design), and the
    plaintext `<role>.key` files of a run folder from before the keystores are migrated into keystores.

    The password is checked on an existing keystore before anything is encrypted with it, so a mistyped password
    at a restart fails with `WrongPasswordError` instead of leaving a run whose keystores need two passwords.
    """
    directory = run_dir / "keys"
    labels = local_key_labels(workers)
    found = _keystores_by_label(directory, labels)
    opened: dict[str, LocalAccount] = {}
    if found:
        label = TRAINER_KEY if TRAINER_KEY in found else next(iter(found))
        opened[label] = load_account(found[label], password)

    def ensure(label: str) -> tuple[Path, LocalAccount | None]:
        plaintext = directory / f"{label}.key"
        if plaintext.exists():
            return _migrate(plaintext, found.get(label), opened.get(label), password, label)
        if label in found:
            return found[label], opened.get(label)
        account: LocalAccount = Account.create()
        return create_keystore(directory, password, label=label, private_key=account.key), account

    threads = max(1, min(len(labels), os.cpu_count() or 1, MAX_PARALLEL_ENCRYPTIONS))
    with ThreadPoolExecutor(threads, thread_name_prefix="keystore") as pool:  # scrypt releases the GIL
        ensured = dict(zip(labels, pool.map(ensure, labels), strict=True))
    path, trainer = ensured[TRAINER_KEY]
    if trainer is None:  # not reached: an existing trainer keystore is the one the password was checked on
        trainer = load_account(path, password)
    worker_paths = tuple(ensured[label][0] for label in labels[1:])
    members = frozenset(read_keystore(path).address for path in worker_paths)
    network = Network(trainer, LOCAL_DOMAIN, LOCAL_POOL_ID, StaticRoles(members=members), EveryUpload())
    return network, LocalWorkerKeys(worker_paths, password)


def _keystores_by_label(directory: Path, labels: Sequence[str]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for info in list_keystores(directory):
        label = info.label
        if label is None or label not in labels:
            continue
        if label in found:
            raise LocalKeyError(
                f"{directory} holds two keystores for {label}: {found[label].name} and {info.path.name};"
                " move the one that is not in use out of the folder"
            )
        found[label] = info.path
    return found


def _migrate(
    plaintext: Path, keystore: Path | None, opened: LocalAccount | None, password: str, label: str
) -> tuple[Path, LocalAccount]:
    """Moves a plaintext key of an older run into a keystore: encrypts it, checks that the keystore decrypts to the
    same address, and only then deletes the plaintext. A keystore already there (a migration cut short after
    writing it) must hold the same key, or nothing is touched."""
    try:
        account: LocalAccount = Account.from_key(bytes.fromhex(plaintext.read_text().strip().removeprefix("0x")))
    except (ValueError, UnicodeDecodeError):
        raise LocalKeyError(f"{plaintext} is not a hex private key; move it out of the folder") from None
    if keystore is None:
        keystore = create_keystore(plaintext.parent, password, label=label, private_key=account.key)
    decrypted = opened or load_account(keystore, password)
    if decrypted.address != account.address:
        raise LocalKeyError(
            f"{keystore.name} holds {decrypted.address} but {plaintext.name} holds {account.address};"
            " keep the one this run used and move the other out of the folder"
        )
    plaintext.unlink()
    log.info(
        "migrated %s to the encrypted keystore %s (%s); deleted the plaintext key",
        plaintext,
        keystore.name,
        account.address,
    )
    return keystore, decrypted


@dataclass
class RunSummary:
    start_step: int
    final_step: int
    steps_trained: int
    seconds: float
    idle_seconds: float
    stale_files: int
    run_dir: Path


class LocalWorkers:
    """The worker processes of local mode: the worker daemon over no chain (`python -m node.daemon.local`), each
    with its state folder `workers/worker-<i>/`; their output goes to `logs/worker-<i>.log`."""

    def __init__(
        self, config: RunConfig, network: Network, keys: LocalWorkerKeys, api_url: str, origin_url: str
    ) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        logs = config.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = os.environ | {
            "OMP_NUM_THREADS": str(config.worker_threads),
            "TOKENIZERS_PARALLELISM": "false",
            PASSWORD_ENV_VAR: keys.password,  # the environment, not argv: the command line is readable by anyone
        }
        from node.daemon.local import local_settings

        for i, key in enumerate(keys.paths):
            state = config.run_dir / "workers" / f"worker-{i}"
            settings = local_settings(state, api_url, origin_url, config.task, threads=config.worker_threads)
            settings_file = state / "worker.toml"
            state.mkdir(parents=True, exist_ok=True)
            settings_file.write_text(settings.to_toml(), encoding="utf-8")
            command = [
                sys.executable, "-m", "node.daemon.local", "--config", str(settings_file),
                "--trainer", network.account.address, "--pool", str(network.pool_id),
                "--chain-id", str(network.domain.chain_id), "--contract", network.domain.verifying_contract,
                "--keystore", str(key), "--async-level", str(config.learner.async_level),
            ]  # fmt: skip
            with (logs / f"worker-{i}.log").open("ab") as out:
                self.processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env))

    def check(self) -> None:
        dead = [(i, p.returncode) for i, p in enumerate(self.processes) if p.poll() is not None]
        if dead and len(dead) == len(self.processes):
            raise RuntimeError(f"every local worker exited ({dead}); see the logs/ folder of the run")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 10
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


async def run_training(
    config: RunConfig,
    network: Network,
    *,
    worker_keys: LocalWorkerKeys | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_ready: Callable[[str, str], None] | None = None,
    control: Control | None = None,
) -> RunSummary:
    """Serves and trains until policy step `config.steps` exists; returns what happened.

    Under torchrun this is rank 0, and `control` its channel to the other ranks, which run `follow_training`
    (`trainer.ranks`): rank 0 alone serves, spawns workers and chooses the files, every rank trains. There SIGTERM
    and SIGINT stop the run after the step in progress; on one process they act as they always have.
    """
    stopping = asyncio.Event()
    # the step loop's one thread: a step reuses the memory the last one freed (trainer.memory)
    with contextlib.ExitStack() as signals, TrainingThread(config.train_threads) as training:
        if control is not None:  # the ranks must stop at one step boundary: the followers wait for rank 0's word
            signals.enter_context(_stop_on_signals(stopping))
        return await _serve_and_train(
            config, network, training, stopping, signals, worker_keys, on_step, on_ready, control
        )


async def _serve_and_train(
    config: RunConfig,
    network: Network,
    training: TrainingThread,
    stopping: asyncio.Event,
    signals: contextlib.ExitStack,
    worker_keys: LocalWorkerKeys | None,
    on_step: Callable[[dict[str, Any]], None] | None,
    on_ready: Callable[[str, str], None] | None,
    control: Control | None,
) -> RunSummary:
    world = World() if control is None else control.world
    loop = await training.run(live_loop, config, world)
    await training.run(resume_loop, loop, control)
    start_step = loop.learner.step
    if not loop.paths.checkpoint(start_step).is_dir():
        await training.run(save_checkpoint, loop, control)
    started = time.monotonic()
    deadline = None if config.max_minutes is None else started + 60 * config.max_minutes
    async with open_services(config, network, loop) as services:  # the coordinator, the origin, gossip, /metrics
        if on_ready is not None:
            on_ready(services.api_url, services.origin_url)
        workers = None
        if worker_keys is not None and worker_keys.paths:
            workers = LocalWorkers(config, network, worker_keys, services.api_url, services.origin_url)
        try:
            await Steps(config, loop, training, services, stopping, control, workers).run(deadline, on_step)
            if control is not None:  # the other ranks are done: nothing they do needs the coordinator
                await asyncio.to_thread(control.send, Decision("stop", loop.learner.step))
            if config.serve_after and not stopping.is_set():
                log.info(
                    "trained to step %d; serving the coordinator and origin until SIGTERM or SIGINT", loop.learner.step
                )
                signals.enter_context(_stop_on_signals(stopping))
                await stopping.wait()
        finally:
            if workers is not None:
                workers.stop()
    return RunSummary(
        start_step=start_step,
        final_step=loop.learner.step,
        steps_trained=loop.learner.step - start_step,
        seconds=time.monotonic() - started,
        idle_seconds=loop.counters.idle_seconds,
        stale_files=loop.counters.stale_files,
        run_dir=config.run_dir,
    )


@dataclass
class Steps:
    """Rank 0's step loop of a live run, over the services that feed it and publish what it trains."""

    config: RunConfig
    loop: TrainingLoop
    training: TrainingThread  # the thread every step trains in (trainer.memory)
    services: Services
    stopping: asyncio.Event  # SIGTERM or SIGINT under torchrun: stop at the next step boundary
    control: Control | None  # under torchrun: rank 0's word to the other ranks
    workers: LocalWorkers | None  # local mode's worker processes, watched while the loop waits

    async def run(self, deadline: float | None, on_step: Callable[[dict[str, Any]], None] | None) -> None:
        """One policy step a turn until the last step, the deadline or a stop: wait for enough accepted data, train
        on it (the step, its checkpoint and state, the held-out evaluation when due), publish the new policy, log."""
        learner = self.loop.learner
        while learner.step < self.config.steps and (deadline is None or time.monotonic() < deadline):
            waited = time.monotonic()
            selection = await self.wait_for_data()
            if selection is None:
                return
            idle = time.monotonic() - waited
            trace.record("wait", idle, step=learner.step)
            # the step on every rank, its checkpoint and state, the held-out evaluation when due (TrainingLoop.train)
            record = await self.training.run(train, self.loop, self.control, selection, idle)
            await self.services.publish(learner.step, selection.files)
            self.services.note(record)
            if on_step is not None:
                on_step(record)

    async def wait_for_data(self) -> Selection | None:
        """The files of the next step once they hold `rollouts_per_step` completions; None once told to stop."""
        while not self.stopping.is_set():
            self.services.arrived.clear()  # before looking: a file that arrives while we look wakes the wait below
            # off the event loop: reading new files would hold up uploads
            selection = await self.training.run(lambda: self.loop.select(self.services.accepted()))
            if selection.rows >= self.config.rollouts_per_step:
                return selection
            if self.workers is not None:
                self.workers.check()
            if self.control is not None and self.control.heartbeat_due():
                await asyncio.to_thread(self.control.send, Decision("wait", self.loop.learner.step))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.services.arrived.wait(), timeout=0.5)
        return None


def _eval_task(path: Path | None) -> tuple[TaskSpec, TaskSource] | None:
    if path is None:
        return None
    spec = load_task_spec(path)
    return spec, open_source(spec)


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set `stop` while the block runs, instead of ending the process. After the last step
    (`serve_after`) it keeps the coordinator up: validators may still fetch files and checkpoints for the challenge
    window, and a pool that stops its coordinator with its last step leaves them nothing to check."""
    loop = asyncio.get_running_loop()

    def stop_now(sig: signal.Signals) -> None:
        log.info("%s: stopping (after the step in progress, if one is)", sig.name)
        stop.set()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop_now, sig)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def live_loop(config: RunConfig, world: World) -> TrainingLoop:
    """This rank's step loop of a live run: rank 0's, or under torchrun a follower's (`trainer.sharded`)."""
    if world.size > 1 and config.eval_every:
        raise TrainerConfigError(
            "[eval] every needs one process: held-out evaluation samples from the whole model, which no rank holds"
            " under torchrun; set it to 0 or run prime-train run without torchrun"
        )
    spec = load_task_spec(config.task)
    precision = resolve_precision(config.device, config.dtype)  # after init_distributed: cuda is the rank's GPU
    log.info("%s", precision.describe())
    learner_config = replace(config.learner, temperature=spec.sampling.temperature or 1.0)
    return open_loop(
        config.model, learner_config, precision, spec, open_source(spec), RunPaths(config.run_dir), world,
        rollouts_per_step=config.rollouts_per_step, max_files_per_step=config.max_files_per_step,
        eval_every=config.eval_every, eval_problems=config.eval_problems, eval_task=_eval_task(config.eval_task),
        max_file_bytes=config.api.max_upload_bytes, order=config.order,
    )  # fmt: skip


def follow_training(config: RunConfig, control: Control) -> int:
    """A rank other than 0 of a live run under torchrun: it serves nothing and chooses nothing, and trains what
    rank 0 (`run_training`) decides until rank 0 stops; returns the steps it trained."""
    loop = live_loop(config, control.world)
    resume_loop(loop, control)
    with torch_threads(config.train_threads):
        return follow(loop, control)


def network_from_pool(config: RunConfig, dev_key: int | None) -> Network:
    """Network mode: the pool's ComputePool decides membership; validators' attestations decide acceptance."""
    from ledger.signers import open_ledger
    from protocol.pool_spec import read_terms
    from trainer.roles import LedgerRoles

    pool = config.pool
    if pool is None:
        raise TrainerConfigError("network mode needs a [pool] table in trainer.toml")
    ledger = open_ledger(pool.deployment, pool.rpc_url, pool.keystore, dev_key)
    account = ledger.account
    if account is None:
        raise TrainerConfigError("network mode needs the trainer's key: [pool] keystore or --dev-key")
    domain = SigningDomain(ledger.deployment.chain_id, ledger.deployment.address("ComputePool"))
    info = ledger.pool(pool.id)
    if info.config.trainer != account.address:  # workers and validators trust only the pool's trainer's signatures
        raise TrainerConfigError(
            f"pool {pool.id}'s trainer is {info.config.trainer}, not this key's {account.address}: use that key"
        )
    terms, _ = read_terms(info)
    roles, accepted = LedgerRoles(ledger, pool.id), AttestedUploads(pool.min_attestations)
    return Network(account, domain, pool.id, roles, accepted, terms)
