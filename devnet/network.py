"""`prime-devnet up`: the whole network on one machine, every role a separate process started through its CLI.

The run, in order (each phase reported through `on_phase`):

1. The policy to start from: the SFT warm-started tiny model (`devnet.warmstart`, cached), and its held-out
   pass rate (`prime-train eval`, cached next to the model).
2. anvil, with the four contracts deployed by development account 0, which also owns the pool and signs as its
   trainer. The pool's `specURI` is the file `pool.toml` in the run folder.
3. The pool: created, funded with reward escrow, validator account 9 allowed; each worker's provider (accounts
   1-4) is minted tokens. The workers stake and register themselves: `prime-node start --register --stake --join`.
4. `prime-train run` (network mode: the coordinator and the SHARDCAST origin), then a relay mirroring the origin,
   then `pool.toml` naming them both, then `prime-validate run` and the workers (`prime-node start`), one of them
   with `--simulate-fault` when there is a cheater.
5. While the trainer works towards `steps`, a `Snapshot` every second: the trainer's last step (reward, batch
   pass rate), the validator's verdicts (its /metrics), and from the chain each node's submissions,
   invalidations (and the stake they burned), membership, its lock in the pool and its provider's stake.
6. When the trainer has written its last step: the workers get SIGTERM (each finishes its file), the validator
   a few seconds to finish what it can still download, then everything stops. The last policy's held-out pass
   rate, the reward curve (`prime-train plot`), and a jump of chain time past the challenge window, after which
   each honest node's provider claims that node's work (one claim per node: work records are per node; an
   ejected node's pending work is void and is not claimed), end the run with a `DevnetReport`: it says where the
   slashed tokens went (burned: `NodeRegistry.burned()`, and each slashed node with its amount) and that the
   escrow is what was funded minus what was claimed.

Every process writes to `<root>/logs/<name>.log`; the report names the folder.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import NodeError
from core.metrics import scrape
from devnet.processes import Child, Supervisor
from devnet.warmstart import DEFAULT_BAND, DEFAULT_CACHE, rl_task, warm_start_model
from engine.model.loading import model_hash_of
from ledger.accounts import dev_account
from ledger.chain import LocalChain, free_port
from ledger.client import Ledger
from ledger.events import BatchInvalidated, BatchSubmitted, EventFollower
from ledger.types import PoolConfig, Reason
from protocol.terms import DEFAULT_ASYNC_LEVEL
from trainer.config import (
    CoordinatorSettings,
    DataSettings,
    PoolLink,
    RunSettings,
    ShardcastSettings,
    TrainerSettings,
)
from trainer.learner import OptimConfig

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TASK = REPO / "configs" / "tasks" / "default.toml"
TOKEN = 10**18
OWNER = 0  # deploys, owns the pool, signs as its trainer
VALIDATOR = 9
PROVIDERS = (1, 2, 3, 4)  # worker i's provider ...
NODES = (5, 6, 7, 8)  # ... and its node key
MAX_WORKERS = len(NODES)
CHEAT_FAULT = "fake-reward"  # caught by the reward check: reason 6, slashed, ejected
FUNDING = 1000  # tokens of reward escrow the pool owner funds


class DevnetError(NodeError):
    """The devnet could not run; the message says which part failed and where its log is."""


@dataclass(frozen=True)
class DevnetSettings:
    root: Path  # the run folder: logs/, run/ (the trainer's), relay/, validator/, workers/, reward.png
    workers: int = 2
    cheater: bool = False
    steps: int = 120
    minutes: float | None = None  # the trainer also stops after this many minutes of RL (its `max_minutes`)
    task: Path = DEFAULT_TASK  # the task: SFT, and the held-out evaluations (its last `eval_problems` problems)
    # the pool's task, which RL draws from; default: `task` without its held-out problems, only those whose pass
    # rate under the starting model lies in `band` (devnet.warmstart.rl_task, cached with the model)
    train_task: Path | None = None
    band: tuple[float, float] = DEFAULT_BAND
    model: Path | None = None  # start from this model instead of the warm-start one
    sft_steps: int = 600
    cache: Path = DEFAULT_CACHE
    rollouts_per_step: int = 256
    prompts_per_task: int = 16
    group_size: int = 8
    async_level: int = DEFAULT_ASYNC_LEVEL  # the pool spec it writes says so (protocol.terms)
    lr: float = 1e-4
    vector_lr_scale: float = 10.0
    eval_problems: int = 256
    eval_samples: int = 4
    stake: int = 100  # tokens each worker's provider stakes for it (the pool's minimum, which each node locks)
    slash: int = 50  # tokens an invalidation burns from the node's lock in the pool (at most `stake`)
    reward_per_unit: float = 0.001  # tokens per output token
    challenge_window: int = 3600  # at least the deployment's minimum challenge window (1 h by default)
    backend: str = "auto"  # the workers' inference engine: auto | vllm | torch (engine.inference.select), on the CPU

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise DevnetError(f"--workers must be 1 to {MAX_WORKERS} (anvil's 10 keys), not {self.workers}")
        if self.cheater and self.workers < 2:
            raise DevnetError("--cheater needs at least 2 workers: one honest worker must keep training going")
        if self.steps < 1:
            raise DevnetError("--steps must be at least 1")
        if self.minutes is not None and not self.minutes > 0:
            raise DevnetError(f"minutes must be positive, not {self.minutes}")
        if self.train_task is not None and not self.train_task.is_file():
            raise DevnetError(f"task spec {self.train_task} not found")
        if not self.task.is_file():
            raise DevnetError(f"task spec {self.task} not found")
        if self.model is not None and not (self.model / "config.json").is_file():
            raise DevnetError(f"--model {self.model} is not a model folder (no config.json in it)")


@dataclass(frozen=True)
class NodeView:
    name: str  # worker-1 ...
    address: str
    provider: str
    cheater: bool
    process: str  # running, stopped, or "exited N"
    member: bool
    ejected: bool
    submitted: int
    invalidated: int
    slashed: int  # base units its invalidations burned from its lock in the pool
    stake: int  # the provider's active stake, base units
    lock: int = 0  # what the node's lock in the pool holds now (`lockOf`), base units; 0 once released
    lock_release_at: int = 0  # when a lock held on after leaving or ejection may be released; 0 while a member


@dataclass(frozen=True)
class Snapshot:
    seconds: float
    step: int
    steps: int
    reward_mean: float | None
    pass_rate: float | None  # of the last step's training batch (the policy's own samples)
    trained_files: int
    submitted: int
    accepted: int
    rejected: dict[str, int]  # by reason label
    nodes: tuple[NodeView, ...]


@dataclass
class DevnetReport:
    root: Path
    logs: Path
    model: Path
    steps: int
    seconds: float  # from the trainer's start to its last step
    idle_seconds: float
    pass_rate_before: float
    pass_rate_after: float
    eval_problems: int
    eval_samples: int
    trained_files: int
    submitted: int
    accepted: int
    rejected: dict[str, int]
    nodes: tuple[NodeView, ...]
    stake_before: dict[str, int]  # provider -> active stake once its node was registered
    claimed: dict[str, int] = field(default_factory=dict)  # provider -> base units claimed after the window
    plot: Path | None = None
    unverified: int = 0  # submitted files the validator had not judged when it stopped
    # Where the slashed tokens went: burned, i.e. kept by the NodeRegistry for good and paid to nobody.
    burned: int = 0  # `NodeRegistry.burned()` at the end, base units
    slashed: dict[str, int] = field(default_factory=dict)  # node -> base units burned from its lock (slashed nodes)
    void: dict[str, int] = field(default_factory=dict)  # ejected node -> its pending files, never paid
    funded: int = 0  # the pool's reward escrow as funded, base units
    escrow: int = 0  # what is left of it at the end: funded - claimed (slashes are not credited to it)

    @property
    def change_points(self) -> float:
        return 100 * (self.pass_rate_after - self.pass_rate_before)

    def as_json(self) -> dict[str, Any]:
        """`report.json` in the run folder: paths as strings, token amounts in base units."""
        return json.loads(json.dumps(asdict(self), default=str))


Phase = Callable[[str], None]
Watch = Callable[[Snapshot], None]


def run_devnet(settings: DevnetSettings, on_phase: Phase, on_snapshot: Watch) -> DevnetReport:
    return Devnet(settings, on_phase, on_snapshot).run()


class Devnet:
    def __init__(self, settings: DevnetSettings, on_phase: Phase, on_snapshot: Watch) -> None:
        self.settings = settings
        self.root = settings.root.resolve()
        self.logs = self.root / "logs"
        self.phase, self.on_snapshot = on_phase, on_snapshot
        self.supervisor = Supervisor(self.root, self.logs)
        self.chain: LocalChain | None = None
        self.pool_id = 0
        self.workers = [f"worker-{i + 1}" for i in range(settings.workers)]
        self.cheat = self.workers[-1] if settings.cheater else None
        # every submitted batch, (node, root) -> its files, in chain order: records are per node, so a root alone
        # names none
        self._submitted: dict[tuple[str, bytes], int] = {}
        self._slots: dict[tuple[str, bytes], int] = {}  # the node's batch slot that holds each batch
        self._dead: set[tuple[str, bytes]] = set()  # invalidated batches (node, root): void, never paid
        self._slashed: dict[str, int] = {}  # node -> base units its invalidations took
        self._stake_before: dict[str, int] = {}
        self._last_validator: dict[str, float] = {}
        self.train_task = settings.train_task or settings.task  # set by run() once the starting model is known

    # --- the run --------------------------------------------------------------------------------------

    def run(self) -> DevnetReport:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            model = self._model()
            before = self._evaluate(model, cache=True)
            self.phase(f"pass rate before RL: {before:.1%} ({self._eval_words()})")
            self.train_task = self._train_task(model)
            owner = self._chain_and_pool(model)
            self._start_roles(owner, model)
            seconds, last = self._watch(owner)
            self.phase(f"trainer finished step {last['step']} in {seconds:.0f} s; stopping workers and validator")
            unverified = self._wind_down()
            snapshot = self._snapshot(owner, last, seconds)
            final = self.root / "run" / "checkpoints" / f"step_{last['step']}"
            after = self._evaluate(final, cache=False)
            self.phase(f"pass rate after RL: {after:.1%} ({self._eval_words()})")
            plot = self._plot()
            claimed, void = self._claim(owner)
            snapshot = self._snapshot(owner, last, seconds)
            burned, escrow = owner.burned(), owner.escrow_of(self.pool_id)
        finally:
            self.supervisor.stop_all()
            if self.chain is not None:
                self.chain.stop()
        report = DevnetReport(
            root=self.root,
            logs=self.logs,
            model=model,
            steps=int(last["step"]),
            seconds=seconds,
            idle_seconds=float(last.get("idle_seconds_total", 0.0)),
            pass_rate_before=before,
            pass_rate_after=after,
            eval_problems=self.settings.eval_problems,
            eval_samples=self.settings.eval_samples,
            trained_files=snapshot.trained_files,
            submitted=snapshot.submitted,
            accepted=snapshot.accepted,
            rejected=snapshot.rejected,
            nodes=snapshot.nodes,
            stake_before=dict(self._stake_before),
            claimed=claimed,
            plot=plot,
            unverified=unverified,
            burned=burned,
            slashed={node: amount for node, amount in self._slashed.items() if amount},
            void=void,
            funded=FUNDING * TOKEN,
            escrow=escrow,
        )
        (self.root / "report.json").write_text(json.dumps(report.as_json(), indent=2) + "\n")
        return report

    def _model(self) -> Path:
        s = self.settings
        if s.model is not None:
            self.phase(f"policy: {s.model}")
            return s.model.resolve()
        started = time.monotonic()
        what = f"{s.sft_steps} SFT steps" if s.sft_steps else "random initialisation"
        self.phase(f"warm-start model ({what}): building or loading from {s.cache}")
        model, cached = warm_start_model(s.task, sft_steps=s.sft_steps, cache=s.cache, log=self.logs / "sft.log")
        self.phase(f"warm-start model: {model} ({'cached' if cached else f'{time.monotonic() - started:.0f} s'})")
        return model

    def _train_task(self, model: Path) -> Path:
        s = self.settings
        if s.train_task is not None:
            self.phase(f"RL task: {s.train_task}")
            return s.train_task.resolve()
        started = time.monotonic()
        low, high = s.band
        self.phase(f"RL task: the problems of {s.task.name} but the held-out ones, with a pass rate in [{low}, {high}]")
        task, cached = rl_task(model, s.task, held_out=s.eval_problems, band=s.band, cache=s.cache,
                               log=self.logs / "filter.log")  # fmt: skip
        self.phase(f"RL task: {task} ({'cached' if cached else f'{time.monotonic() - started:.0f} s'})")
        return task

    def _eval_words(self) -> str:
        return f"{self.settings.eval_problems} held-out problems x {self.settings.eval_samples} samples"

    def _evaluate(self, model: Path, *, cache: bool) -> float:
        """Held-out pass rate through `prime-train eval`; with `cache`, remembered next to the model."""
        s = self.settings
        memo = model.parent / f"{model.name}.eval-{s.eval_problems}x{s.eval_samples}.json"
        if cache and memo.is_file():
            return float(json.loads(memo.read_text())["pass_rate"])
        self.phase(f"measuring the pass rate of {model.name} ({self._eval_words()})")
        command = [sys.executable, "-m", "trainer.cli", "eval", "--model", str(model), "--task", str(s.task)]
        command += ["--problems", str(s.eval_problems), "--samples", str(s.eval_samples), "--json"]
        with (self.logs / "eval.log").open("ab") as log:
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise DevnetError(f"`prime-train eval` failed (exit {done.returncode}); see {self.logs / 'eval.log'}")
        rate = float(json.loads(done.stdout)["pass_rate"])
        if cache:
            memo.write_text(json.dumps({"pass_rate": rate}))
        return rate

    def _chain_and_pool(self, model: Path) -> Ledger:
        s = self.settings
        self.phase("anvil: starting, deploying the contracts")
        self.chain = LocalChain(log_path=self.logs / "anvil.log").start()
        deployment = self.chain.deploy()
        deployment.save(self.root / "deployment.json")
        owner = Ledger(self.chain.w3, deployment, dev_account(OWNER))
        config = PoolConfig(
            name="devnet",
            model_hash=model_hash_of(model),
            spec_uri=(self.root / "pool.toml").as_uri(),
            trainer=owner.address,
            min_stake_per_node=s.stake * TOKEN,
            challenge_window=s.challenge_window,
            reward_per_unit=int(s.reward_per_unit * TOKEN),
            slash_amount=s.slash * TOKEN,
            max_nodes=0,
        )
        self.pool_id = owner.create_pool(config)
        owner.mint(owner.address, FUNDING * TOKEN)
        owner.fund_rewards(self.pool_id, FUNDING * TOKEN)
        owner.set_validator(self.pool_id, dev_account(VALIDATOR).address)
        for i in range(s.workers):
            owner.mint(dev_account(PROVIDERS[i]).address, 2 * s.stake * TOKEN)
        self.phase(
            f"pool {self.pool_id} on {self.chain.rpc_url}: {FUNDING} tokens of rewards, min stake {s.stake} locked"
            f" per node, slash {s.slash} (burned from the node's lock), validator {dev_account(VALIDATOR).address}"
        )
        return owner

    def _start_roles(self, owner: Ledger, model: Path) -> None:
        s = self.settings
        # the trainer reads the pool's terms from pool.toml as it starts, so the spec comes first, naming the ports
        # the trainer is about to take; the relay joins its checkpoints once it runs
        api_port, origin_port = free_port(), free_port()
        self._write_pool_spec(f"http://127.0.0.1:{api_port}", [f"http://127.0.0.1:{origin_port}"])
        self._write_trainer_config(model, api_port, origin_port)
        trainer = self.supervisor.start("trainer", "trainer.cli", "run", "--config", "trainer.toml", "--dev-key", "0")
        endpoints = self.root / "run" / "endpoints.json"
        self._wait(lambda: endpoints.is_file(), "the trainer's coordinator and origin", trainer, 120)
        urls = json.loads(endpoints.read_text())
        relay = self.supervisor.start(
            "relay", "node.cli.main", "relay", "--upstream", urls["origin"], "--data", "relay", "--port", "0",
            "--trainer", urls["trainer"], "--deployment", "deployment.json",
        )  # fmt: skip
        self._wait(lambda: "relay on http://" in relay.log.read_text(), "the relay", relay, 60)
        relay_url = relay.log.read_text().split("relay on ", 1)[1].split(",", 1)[0].strip()
        self._write_pool_spec(urls["coordinator"], [relay_url, urls["origin"]])
        self.phase(f"trainer {urls['trainer']}: coordinator {urls['coordinator']}, origin {urls['origin']}")
        self.phase(f"relay {relay_url} mirrors the origin")
        pool = ("--pool", str(self.pool_id), "--deployment", "deployment.json")
        self.supervisor.start(
            "validator", "validator.cli", "run", *pool, "--dev-key", str(VALIDATOR), "--state", "validator",
            "--metrics-port", "0", "--poll", "0.5", "--threads", "1",
        )  # fmt: skip
        for i, name in enumerate(self.workers):
            args = [*pool, "--dev-key", str(NODES[i]), "--state", f"workers/{name}", "--threads", "1"]
            args += ["--register", "--provider-dev-key", str(PROVIDERS[i]), "--stake", str(s.stake), "--join"]
            args += ["--submit-batch", "1", "--backend", s.backend, "--device", "cpu"]
            if name == self.cheat:
                args += ["--simulate-fault", CHEAT_FAULT]
            self.supervisor.start(name, "node.cli.main", "start", *args)
            kind = f"cheater: --simulate-fault {CHEAT_FAULT}" if name == self.cheat else "honest"
            self.phase(f"{name} ({kind}): node {dev_account(NODES[i]).address}, provider key {PROVIDERS[i]}")
        self._wait(lambda: self._registered(owner), "the workers to stake, register and join", None, 120)
        for i in range(s.workers):
            provider = dev_account(PROVIDERS[i]).address
            self._stake_before[provider] = owner.stake_of(provider).active

    def _registered(self, owner: Ledger) -> bool:
        return all(owner.is_member(self.pool_id, dev_account(NODES[i]).address) for i in range(len(self.workers)))

    def _write_pool_spec(self, coordinator: str, checkpoints: list[str]) -> None:
        listed = ", ".join(f'"{url}"' for url in checkpoints)
        (self.root / "pool.toml").write_text(
            f"# written by prime-devnet up: pool {self.pool_id}'s terms and where its parts are\n"
            f'coordinator = "{coordinator}"\n'
            f"checkpoints = [{listed}]\n"
            f'task = "{self.train_task}"\n'
            f"async_level = {self.settings.async_level}\n"
            f"prompts_per_task = {self.settings.prompts_per_task}\n"
            f"group_size = {self.settings.group_size}\n"
        )

    def _write_trainer_config(self, model: Path, api_port: int, origin_port: int) -> None:
        s, root = self.settings, self.root
        run = RunSettings(
            dir=root / "run", model=model.resolve(), task=self.train_task.resolve(), steps=s.steps,
            max_minutes=s.minutes or 0.0, serve_after=True, threads=1,
        )  # fmt: skip
        settings = TrainerSettings(
            run=run,
            data=DataSettings(async_level=s.async_level, rollouts_per_step=s.rollouts_per_step),
            optim=OptimConfig(lr=s.lr, vector_lr_scale=s.vector_lr_scale, warmup_steps=3, micro_batch_tokens=16384),
            coordinator=CoordinatorSettings(
                port=api_port, prompts_per_task=s.prompts_per_task, group_size=s.group_size
            ),
            shardcast=ShardcastSettings(port=origin_port, keep=s.async_level + 3),
            pool=PoolLink(id=self.pool_id, deployment=root / "deployment.json"),
        )
        header = "# written by prime-devnet up (configs/trainer.toml documents every key)\n"
        (root / "trainer.toml").write_text(header + settings.to_toml())

    # --- watching -----------------------------------------------------------------------------------------

    def _watch(self, owner: Ledger) -> tuple[float, dict[str, float]]:
        """Snapshots until the trainer has written its last step (it then serves on: `serve_after`); its run
        time and last metrics record."""
        started = time.monotonic()
        self._follower = EventFollower(owner, pool_id=self.pool_id, events=("BatchSubmitted", "BatchInvalidated"))
        last: dict[str, float] = {}
        while True:
            self._check_alive()
            done = self._trainer_done()  # asked before the read: the trainer writes its last record, then says so
            last = self._last_step() or last
            self.on_snapshot(self._snapshot(owner, last, time.monotonic() - started))
            if done or last.get("step", 0) >= self.settings.steps:
                return float(last.get("seconds", time.monotonic() - started)), last
            time.sleep(1.0)

    def _trainer_done(self) -> bool:
        """Whether the trainer stopped training (its step or time limit) and now only serves (`serve_after`)."""
        trainer = self.supervisor.children.get("trainer")
        return trainer is not None and "serving the coordinator and origin until" in trainer.log.read_text()

    def _check_alive(self) -> None:
        for name, child in self.supervisor.children.items():
            if child.running:
                continue
            if name == self.cheat and child.process.returncode == 1 and "ejected" in child.log.read_text():
                continue  # the cheater was caught: it exits 1 saying why
            code = child.process.returncode
            raise DevnetError(f"{name} exited with code {code}; the end of {child.log}:\n{child.tail()}")

    def _last_step(self) -> dict[str, float] | None:
        path = self.root / "run" / "metrics.jsonl"
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            try:
                record: dict[str, float] = json.loads(line)
            except ValueError:
                continue  # the line being written
            return record
        return None

    def _snapshot(self, owner: Ledger, last: dict[str, float], seconds: float) -> Snapshot:
        for event in self._follower.poll():
            if isinstance(event, BatchSubmitted):
                self._submitted[(event.node, event.root)] = event.count
                self._slots[(event.node, event.root)] = event.slot
            elif isinstance(event, BatchInvalidated):  # names the node whose batch it voided
                self._slashed[event.node] = self._slashed.get(event.node, 0) + event.slashed
                self._dead.add((event.node, event.root))
        validator = self._validator_metrics()
        rejected = {
            Reason.label(r.value): int(validator.get(f'validator_files_rejected_total{{reason="{r.name.lower()}"}}', 0))
            for r in Reason
        }
        nodes = []
        submitted: Counter[str] = Counter()
        for (node, _), files in self._submitted.items():
            submitted[node] += files
        invalidated = Counter(node for node, _ in self._dead)  # batches
        for i, name in enumerate(self.workers):
            address, provider = dev_account(NODES[i]).address, dev_account(PROVIDERS[i]).address
            child = self.supervisor.children.get(name)
            state = "running" if child and child.running else f"exited {child.process.returncode}" if child else "-"
            lock = owner.lock_of(self.pool_id, address)
            nodes.append(
                NodeView(
                    name=name,
                    address=address,
                    provider=provider,
                    cheater=name == self.cheat,
                    process=state,
                    member=owner.is_member(self.pool_id, address),
                    ejected=owner.is_ejected(self.pool_id, address),
                    submitted=submitted[address],
                    invalidated=invalidated[address],
                    slashed=self._slashed.get(address, 0),
                    stake=owner.stake_of(provider).active,
                    lock=lock.amount,
                    lock_release_at=lock.release_at,
                )
            )
        return Snapshot(
            seconds=seconds,
            step=int(last.get("step", 0)),
            steps=self.settings.steps,
            reward_mean=last.get("reward_mean"),
            pass_rate=last.get("pass_rate"),
            trained_files=self._trained_files(),
            submitted=sum(self._submitted.values()),
            accepted=int(validator.get("validator_files_accepted_total", 0)),
            rejected={k: v for k, v in rejected.items() if v},
            nodes=tuple(nodes),
        )

    def _validator_metrics(self) -> dict[str, float]:
        child = self.supervisor.children.get("validator")
        endpoints = self.root / "validator" / "endpoints.json"
        if child is None or not child.running or not endpoints.is_file():
            return self._last_validator
        with contextlib.suppress(OSError, ValueError, KeyError):  # starting or stopping: keep the last reading
            self._last_validator = scrape(json.loads(endpoints.read_text())["metrics"], timeout=2.0)
        return self._last_validator

    def _trained_files(self) -> int:
        path = self.root / "run" / "trained.jsonl"
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return 0
        count = 0
        for line in lines:
            try:
                count += len(json.loads(line)["work_keys"])
            except (ValueError, KeyError):
                continue
        return count

    # --- the end ----------------------------------------------------------------------------------------

    def _wind_down(self) -> int:
        """Stops the workers (each submits the file in hand), lets the validator judge what was submitted while the
        coordinator still serves the files, then stops the rest; returns the files left unjudged."""
        self.supervisor.stop(*self.workers, grace=60.0)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and self._validator_metrics().get("validator_open_files", 0) > 0:
            time.sleep(0.5)
        open_files = int(self._validator_metrics().get("validator_open_files", 0))
        self.supervisor.stop("validator", "relay", "trainer", grace=20.0)
        trainer = self.supervisor.children["trainer"]
        if trainer.process.returncode != 0:
            raise DevnetError(f"the trainer exited with code {trainer.process.returncode}:\n{trainer.tail()}")
        return open_files

    def _plot(self) -> Path | None:
        png = self.root / "reward.png"
        command = [sys.executable, "-m", "trainer.cli", "plot", "--metrics", str(self.root / "run" / "metrics.jsonl")]
        command += ["--out", str(png), "--title", "prime-devnet up: reward and pass rate per step"]
        with (self.logs / "plot.log").open("ab") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return png if done.returncode == 0 and png.is_file() else None

    def _claim(self, owner: Ledger) -> tuple[dict[str, int], dict[str, int]]:
        """Moves chain time past the challenge window; each honest provider claims its node's surviving batches,
        one claim per node. Returns what each provider was paid, and the pending files of each node an invalidation
        ejected: void, never paid (`claimBatches` refuses it with `NodeEjected`), so not claimed."""
        assert self.chain is not None
        self.chain.increase_time(self.settings.challenge_window + 1)
        claimed: dict[str, int] = {}
        void: dict[str, int] = {}
        for i, name in enumerate(self.workers):
            node = dev_account(NODES[i]).address
            roots = [r for n, r in self._submitted if n == node and (n, r) not in self._dead]  # none claimed yet
            if owner.is_voided(self.pool_id, node):
                if roots:
                    void[node] = sum(self._submitted[(node, r)] for r in roots)
                continue
            if name == self.cheat or not roots:
                continue
            provider = owner.as_account(dev_account(PROVIDERS[i]))
            before = provider.balance_of(provider.address)
            provider.claim_batches(self.pool_id, node, roots, slots=[self._slots[(node, r)] for r in roots])
            claimed[provider.address] = provider.balance_of(provider.address) - before
        if claimed:
            window = self.settings.challenge_window
            self.phase(f"chain time moved past the {window} s challenge window; the honest providers claimed")
        return claimed, void

    def _wait(self, ready: Callable[[], bool], what: str, child: Child | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if child is not None and not child.running:
                raise DevnetError(f"{child.name} exited with code {child.process.returncode} while waiting for {what}:"
                                  f"\n{child.tail()}")  # fmt: skip
            self._check_alive()
            if time.monotonic() > deadline:
                raise DevnetError(f"timed out after {timeout:.0f} s waiting for {what}; logs in {self.logs}")
            time.sleep(0.25)
