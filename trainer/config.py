"""`trainer.toml`: every setting of `prime-train run`, validated with one-line errors naming file and field.

configs/trainer.toml documents each field. Relative paths are resolved against the TOML file's folder, so a
config and the model and task it names can move together.
"""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from protocol.tasks.errors import TaskSpecError
from protocol.tasks.fields import Fields
from protocol.tasks.spec import load_task_spec, spec_hash
from protocol.terms import (
    DEFAULT_ASYNC_LEVEL,
    DEFAULT_GROUP_SIZE,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_PROMPTS_PER_TASK,
    MAX_ASYNC_LEVEL,
    MAX_FILE_BYTES,
    MAX_REPLICATION,
    MIN_FILE_BYTES,
    PoolTerms,
)
from shardcast.manifest import FORMAT_VERSION, FORMATS
from trainer.api import ApiConfig
from trainer.errors import TrainerError
from trainer.grpo import GRPOConfig
from trainer.learner import LearnerConfig
from trainer.loop import FILE_ORDERS, FileOrder
from trainer.precision import DEVICES, DTYPES, check_choice

AUTO = -1  # a per-node limit not given: derived from rollouts_per_step, the assignment size and the window


class TrainerConfigError(TrainerError, ValueError):
    """trainer.toml is missing, unreadable, or holds a bad value."""


@dataclass(frozen=True)
class PoolLink:
    """`[pool]`: how the trainer finds its pool on chain (network mode): who may upload is asked of ComputePool,
    files count once attested. Not the pool's on-chain config, which is `ledger.types.PoolConfig`."""

    id: int
    deployment: Path
    rpc_url: str | None = None
    keystore: Path | None = None  # the trainer's key; `--dev-key` on the command line for a local devnet
    min_attestations: int = 1  # accepting validator verdicts a file needs (and no rejection) before training


@dataclass(frozen=True)
class GossipConfig:
    """`[p2p]`: the trainer's libp2p host, which announces every checkpoint and is the pool's bootstrap peer."""

    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port; a bootstrap peer wants a fixed one


@dataclass(frozen=True)
class RunConfig:
    run_dir: Path  # state, checkpoints, inbox, metrics, logs
    model: Path  # the initial policy (Hugging Face layout)
    task: Path  # task spec (TOML)
    steps: int = 20  # train until this policy step exists
    max_minutes: float | None = None  # or stop after the first step that ends past this many minutes
    serve_after: bool = False  # after the last step, keep serving the API and the origin until SIGTERM or SIGINT
    rollouts_per_step: int = 256  # completions that must be available before a step trains
    max_files_per_step: int = 256
    order: FileOrder = "oldest"  # which files of the async window a step takes first (trainer.loop.FILE_ORDERS)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    host: str = "127.0.0.1"
    api_port: int = 8600
    shardcast_port: int = 8700
    keep_versions: int = 4  # checkpoint versions the origin serves (at least async_level + 2)
    manifest_format: int = FORMAT_VERSION  # SHARDCAST manifest format the origin signs (1 for a pool of old nodes)
    eval_every: int = 0  # steps between held-out evaluations; 0 = never
    eval_problems: int = 128
    eval_task: Path | None = None  # the spec whose last eval_problems problems are measured; None: the run's task
    local_workers: int = 0  # > 0: local mode, the trainer starts and trusts its own workers
    worker_threads: int = 1  # torch threads per local worker
    train_threads: int = 0  # torch threads of the trainer; 0 = torch's default
    device: str = "auto"  # where the trainer trains (trainer.precision.DEVICES): auto = CUDA when present
    dtype: str = "auto"  # compute dtype (trainer.precision.DTYPES): auto = bfloat16 on CUDA, float32 on the CPU
    pool: PoolLink | None = None  # network mode: the pool on chain
    p2p: GossipConfig | None = None  # None: no gossip
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("device", self.device, DEVICES)  # the flags reach here without the TOML's checks
        check_choice("dtype", self.dtype, DTYPES)
        if self.steps < 1 or self.rollouts_per_step < 1 or self.max_files_per_step < 1:
            raise ValueError("steps, rollouts_per_step and max_files_per_step must be at least 1")
        if self.keep_versions < self.learner.async_level + 2:
            raise ValueError(
                f"keep_versions ({self.keep_versions}) must be at least async_level + 2 "
                f"({self.learner.async_level + 2}): workers may still be fetching a policy inside the window"
            )
        if self.local_workers == 0 and self.pool is None:
            raise ValueError("set [local] workers > 0 for local mode, or a [pool] table for the network")

    @property
    def local(self) -> bool:
        return self.local_workers > 0


def load_run_config(path: str | Path, *, terms: PoolTerms | None = None, **overrides: Any) -> RunConfig:
    """Reads trainer.toml; `overrides` (command-line flags, None = not given) replace RunConfig fields.

    With `terms` (network mode: the pool's, `protocol.terms`), a setting that is one of the pool's terms (the async
    level, the file-size limit, the group shape, the task) takes the pool's value when the TOML leaves it out, and
    one that contradicts the pool is refused naming the key: a trainer with a narrower window than the validators
    would drop files the pool paid for, one with another task would hand out assignments validators refuse.
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TrainerConfigError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TrainerConfigError(f"{path}: not readable TOML ({exc})") from None
    try:
        return _parse(path, raw, {k: v for k, v in overrides.items() if v is not None}, terms)
    except TaskSpecError as exc:
        raise TrainerConfigError(str(exc)) from None
    except ValueError as exc:
        raise TrainerConfigError(f"{path}: {exc}") from None


def _path(base: Path, text: str) -> Path:
    candidate = Path(text).expanduser()
    return candidate if candidate.is_absolute() else (base / candidate).resolve()


def _term(table: Fields, key: str, terms: PoolTerms | None, term: str, default: int, **bounds: int) -> int:
    """An integer setting that is one of the pool's terms: the pool's value unless the TOML says otherwise, and then
    refused (without `terms`, local mode, the trainer's own choice, `default` when left out)."""
    pool = default if terms is None else getattr(terms, term)
    value = table.integer(key, pool, **bounds)
    if terms is not None and value != pool:
        table.fail(key, f"is {value}, but {terms.source} says {pool}: the pool's terms bind every role (leave it out)")
    return value


def _check_task(table: Fields, task: Path, terms: PoolTerms | None) -> None:
    if terms is None or terms.task_hash is None:
        return
    own = spec_hash(load_task_spec(task))
    if own != terms.task_hash:
        table.fail(
            "task",
            f"{task} (hash 0x{own.hex()[:12]}) is not the task of {terms.source}, {terms.task_path} "
            f"(hash 0x{terms.task_hash.hex()[:12]}): the pool's assignments sign its hash",
        )


def _parse(path: Path, raw: dict[str, Any], overrides: dict[str, Any], terms: PoolTerms | None) -> RunConfig:
    base = path.resolve().parent
    top = Fields(path, "", raw)
    run = Fields(path, "run", top.table("run"))
    data = Fields(path, "data", top.table("data", required=False))
    optim = Fields(path, "optim", top.table("optim", required=False))
    loss = Fields(path, "loss", top.table("loss", required=False))
    coord = Fields(path, "coordinator", top.table("coordinator", required=False))
    shardcast = Fields(path, "shardcast", top.table("shardcast", required=False))
    evaluation = Fields(path, "eval", top.table("eval", required=False))
    local = Fields(path, "local", top.table("local", required=False))
    pool_table = top.table("pool", required=False)
    p2p_table = top.table("p2p", required=False)
    top.done()

    grpo = GRPOConfig(
        eps_low=loss.number("eps_low", 0.2, minimum=0, maximum=1),
        eps_high=loss.number("eps_high", 0.2, minimum=0),
        delta=loss.number("delta", 4.0, minimum=1),
        entropy_coef=loss.number("entropy_coef", 0.0, minimum=0),
        kl_coef=loss.number("kl_coef", 0.0, minimum=0),
    )
    learner = LearnerConfig(
        lr=optim.number("lr", 3e-4, minimum=1e-9, maximum=0.5),
        warmup_steps=optim.integer("warmup_steps", 3, minimum=0),
        weight_decay=optim.number("weight_decay", 0.0, minimum=0),
        beta1=optim.number("beta1", 0.9, minimum=0, maximum=0.9999),
        beta2=optim.number("beta2", 0.99, minimum=0, maximum=0.9999),
        eps=optim.number("eps", 1e-8, minimum=1e-12, maximum=0.1),
        grad_clip=optim.number("grad_clip", 1.0, minimum=1e-6),
        vector_lr_scale=optim.number("vector_lr_scale", 1.0, minimum=1e-3, maximum=1000),
        micro_batch_tokens=optim.integer("micro_batch_tokens", 8192, minimum=2),
        async_level=_term(
            data, "async_level", terms, "async_level", DEFAULT_ASYNC_LEVEL, minimum=0, maximum=MAX_ASYNC_LEVEL
        ),
        temperature=1.0,  # set from the task spec by the run; kept out of the TOML so the two cannot disagree
        loss=grpo,
        seed=run.integer("seed", 0, minimum=0),
    )
    api = ApiConfig(
        max_upload_bytes=_term(
            coord,
            "max_upload_bytes",
            terms,
            "max_file_bytes",
            DEFAULT_MAX_FILE_BYTES,
            minimum=MIN_FILE_BYTES,
            maximum=MAX_FILE_BYTES,
        ),
        max_skew=coord.number("max_skew", 300.0, minimum=1),
        prompts_per_task=_term(
            coord, "prompts_per_task", terms, "prompts_per_task", DEFAULT_PROMPTS_PER_TASK, minimum=1, maximum=4096
        ),
        group_size=_term(coord, "group_size", terms, "group_size", DEFAULT_GROUP_SIZE, minimum=2, maximum=1024),
        async_level=learner.async_level,
    )
    per_node = coord.integer("files_per_node_per_step", AUTO, minimum=AUTO)
    pending = coord.integer("pending_files_per_node", AUTO, minimum=AUTO)
    in_flight = coord.integer("max_files_in_flight", AUTO, minimum=AUTO)
    stored_files = coord.integer("max_stored_files_per_node", AUTO, minimum=AUTO)
    stored_bytes = coord.integer("max_stored_bytes_per_node", AUTO, minimum=AUTO)
    order = data.text("order", "")
    device = run.text("device", "auto")
    if device not in DEVICES:
        run.fail("device", f"must be one of {', '.join(DEVICES)}, got {device!r}")
    dtype = run.text("dtype", "auto")
    if dtype not in DTYPES:
        run.fail("dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if order and order not in FILE_ORDERS:
        data.fail("order", f"must be one of {', '.join(FILE_ORDERS)}, got {order!r}")
    pool = None
    if pool_table:
        fields = Fields(path, "pool", pool_table)
        keystore = fields.text("keystore", "")
        pool = PoolLink(
            id=fields.integer("id", minimum=0),
            deployment=_path(base, fields.text("deployment", nonempty=True)),
            rpc_url=fields.text("rpc_url", "") or None,
            keystore=_path(base, keystore) if keystore else None,
            min_attestations=fields.integer("min_attestations", 1, minimum=1, maximum=MAX_REPLICATION),
        )
        if terms is not None and pool.min_attestations > terms.replication:  # validators split the keys
            fields.fail(
                "min_attestations",
                f"is {pool.min_attestations}, but {terms.source} has each key checked by {terms.replication} "
                "validator(s) (replication): no file would ever be trained on",
            )
        fields.done()
    p2p = None
    if "p2p" in raw:  # an empty [p2p] table turns gossip on with the defaults
        fields = Fields(path, "p2p", p2p_table)
        p2p_host = fields.text("host", "127.0.0.1", nonempty=True)
        try:
            ipaddress.IPv4Address(p2p_host)
        except ValueError:
            fields.fail("host", f"must be an IPv4 address (libp2p listens on one), got {p2p_host!r}")
        p2p = GossipConfig(host=p2p_host, port=fields.integer("port", 0, minimum=0, maximum=65535))
        fields.done()
    task = _path(base, run.text("task", nonempty=True))
    _check_task(run, task, terms)
    values: dict[str, Any] = dict(
        run_dir=_path(base, run.text("dir", nonempty=True)),
        model=_path(base, run.text("model", nonempty=True)),
        task=task,
        steps=run.integer("steps", 20, minimum=1),
        max_minutes=run.number("max_minutes", 0.0, minimum=0) or None,
        serve_after=run.boolean("serve_after", False),
        seed=learner.seed,
        train_threads=run.integer("threads", 0, minimum=0, maximum=1024),
        device=device,
        dtype=dtype,
        rollouts_per_step=data.integer("rollouts_per_step", 256, minimum=1),
        max_files_per_step=data.integer("max_files_per_step", 256, minimum=1),
        learner=learner,
        api=api,
        host=coord.text("host", "127.0.0.1", nonempty=True),
        api_port=coord.integer("port", 8600, minimum=0, maximum=65535),
        shardcast_port=shardcast.integer("port", 8700, minimum=0, maximum=65535),
        keep_versions=shardcast.integer("keep", max(4, learner.async_level + 2), minimum=1, maximum=1000),
        manifest_format=shardcast.integer(
            "manifest_format", FORMAT_VERSION, minimum=min(FORMATS), maximum=max(FORMATS)
        ),
        eval_every=evaluation.integer("every", 0, minimum=0),
        eval_problems=evaluation.integer("problems", 128, minimum=1, maximum=100_000),
        eval_task=_path(base, eval_task) if (eval_task := evaluation.text("task", "")) else None,
        local_workers=local.integer("workers", 0, minimum=0, maximum=256),
        worker_threads=local.integer("threads", 1, minimum=1, maximum=256),
        pool=pool,
        p2p=p2p,
    )
    for table in (run, data, optim, loss, coord, shardcast, evaluation, local):
        table.done()
    per_file = api.prompts_per_task * api.group_size
    needed = -(-values["rollouts_per_step"] // per_file)  # files a step trains on
    workers = overrides.get("local_workers", values["local_workers"])
    if per_node == AUTO:
        # a network node alone can fill a step, with half as much again for files lost or late; the trainer's own
        # workers are limited by what it has not trained yet instead
        per_node = 0 if workers else needed + -(-needed // 2)
    if not order:  # what is handed out is capped below, so no file needs to go stale: first come, first trained
        order = "oldest"
    if pending == AUTO:
        # local workers: the files of the k + 1 steps the window holds, shared out. Each worker then generates
        # while the trainer trains, up to k steps ahead, and makes none that would go stale, as the oldest go first.
        # Were the freshest to go first, a worker more than one step ahead would see its older files wait behind
        # its newer ones until they left the window: then only the step being trained and the next one.
        k = learner.async_level
        steps_ahead = k + 1 if order == "oldest" else min(k, 1) + 1
        pending = -(-needed * steps_ahead // workers) if workers else 0
    if in_flight == AUTO:
        # a network: the pool's assignments that may still be trained on, at most the files of the k + 1 steps the
        # window holds (trainer.in_flight); local workers are capped by `pending` instead
        in_flight = 0 if workers else needed * (learner.async_level + 1)
    # An honest node at the pool's pace stores at most its share of each step of the window and of the step it
    # generates for: (k + 2) shares. The quota leaves it 4 times that many files, and twice that many at the size
    # limit; a member that fills it waits for the trainer's next step, like a node over its assignments.
    share = max(per_node, -(-needed * 3 // 2), pending)
    honest = (learner.async_level + 2) * share
    if stored_files == AUTO:
        stored_files = 4 * honest
    if stored_bytes == AUTO:
        stored_bytes = 2 * honest * api.max_upload_bytes
    values["order"] = order
    values["api"] = replace(
        api,
        files_per_node_per_step=per_node,
        pending_files_per_node=pending,
        max_files_in_flight=in_flight,
        max_stored_files_per_node=stored_files,
        max_stored_bytes_per_node=stored_bytes,
    )
    return RunConfig(**(values | overrides))
