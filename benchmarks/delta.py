"""Delta checkpoints, measured: the bytes of one step's delta against the full checkpoint (shardcast/delta.py), and
the time for a step to reach its clients whole and as a delta.

    .venv/bin/python benchmarks/delta.py [--layers 2] [--steps 3] [--lrs 1e-6 1e-5 1e-4] [--skip-real] [--save DIR]
    .venv/bin/python benchmarks/delta.py --propagate DIR [--clients 1 4] [--repeats 3] [--relay-rate MB/S]

For each model (the tiny one; Qwen2.5-0.5B's shape with `--layers` of its 24 layers) and each learning rate, the
trainer's own loop (`trainer.sharded.open_loop`: float32 master weights, AdamW without warm-up, so every step is at
the stated rate) takes `--steps` consecutive GRPO steps on one rollout file of that model (4 prompts x 4 completions
of the default task, rewards 1, 0, 1, 0 within each group so that every group has a gradient). Before the first step
and after each one the policy is written as a pool of each precision would publish it: every tensor in the pool's
precision (bfloat16, float32), one safetensors file, the tied LM head once. Each step's delta against the step before
is encoded, applied to the step before and compared byte for byte with the step, and the last step's delta against
the first is encoded too (a client that many steps behind: one delta, against the chain of single-step ones).

Per model, precision and rate it prints: the full file's bytes, the mean delta's bytes and its share of the full,
the share of words changed, the seconds to encode and to apply one delta, and the direct and chained deltas from the
first step to the last. `--save DIR` keeps each model's, precision's and rate's first two policies as checkpoint
folders (`DIR/<model>-<dtype>-<lr>/step_0`, `step_1`: the model's config.json and the policy's safetensors file).

`--propagate DIR` takes such a pair (`DIR/step_0`, `DIR/step_1`) through the processes a pool runs: `prime-node
origin` (whole steps only, `--no-delta`; or whole steps and deltas, `--delta-min-mib 0`), one `prime-node relay`,
and N `prime-node fetch-weights` clients (`--relay-rate`: the relay's uplink, which its clients share). The clients
fetch step 0 first (as step 1), then wait for the next step with `--after 1` (step_1 is handed to the origin once
the relay holds step 0 complete), and the clock runs from the origin's `published` event of step 2 (step_1) to the
last client's exit. It prints, per mode and N (medians of `--repeats`): that time, the origin's publish (copy,
delta, hashes, signature), the bytes each client moved, the seconds each spent applying, and the CPU seconds of the
relay and of each client while the clock ran (benchmarks/shardcast.py's process harness). Every client's step is
compared with step_1.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASK = REPO / "configs" / "tasks" / "default.toml"
NODE = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"
DTYPES = ["bfloat16", "float32"]  # the pools' precisions measured (--dtypes)


@dataclasses.dataclass
class Row:
    model: str
    dtype: str
    lr: float
    full: int = 0
    deltas: list[int] = dataclasses.field(default_factory=list)
    changed: list[float] = dataclasses.field(default_factory=list)
    encode: list[float] = dataclasses.field(default_factory=list)
    apply: list[float] = dataclasses.field(default_factory=list)
    direct: int = 0  # first step -> last step, one delta
    direct_changed: float = 0.0


def published(model: Any, dtype: str, out: Path) -> Path:
    """The policy as a pool of `dtype` publishes it: every tensor in `dtype`, a tied head once."""
    import torch
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        tensors[name] = tensor.detach().to(getattr(torch, dtype)).contiguous()
    save_file(tensors, str(out))
    return out


def rollout_file(model_dir: Path, work: Path) -> Any:
    """One file of the model's own completions, rewards 1, 0, 1, 0 within each group."""
    from benchmarks.real_shape import mixed_rewards
    from engine.generate import generate_rollouts
    from engine.inference.torch_backend import TorchBackend
    from engine.model.loading import load_model
    from protocol.plan import Job
    from protocol.rollouts import read_rollouts
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from protocol.terms import MAX_FILE_BYTES

    spec = load_task_spec(TASK)
    source = open_source(spec)
    loaded = load_model(model_dir)
    job = Job(pool_id=0, node=NODE, step=0, counter=0, prompts=4, group_size=4)
    written = generate_rollouts(job, spec, source, loaded, TorchBackend.from_loaded(loaded)).write(
        work / "file.parquet"
    )
    return mixed_rewards(read_rollouts(written.path, max_bytes=MAX_FILE_BYTES))


def save_pair(model_dir: Path, snapshots: list[Path], out: Path) -> None:
    """Steps 0 and 1 of one run as checkpoint folders under `out`, for `--propagate`."""
    import shutil

    for step, snapshot in enumerate(snapshots[:2]):
        folder = out / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model_dir / "config.json", folder / "config.json")
        shutil.copyfile(snapshot, folder / "model.safetensors")


def measure(
    label: str, model_dir: Path, lrs: list[float], steps: int, work: Path, save: Path | None = None
) -> list[Row]:
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from shardcast.delta import apply_delta, encode_delta
    from trainer.learner import LearnerConfig, World
    from trainer.loop import RunPaths
    from trainer.precision import resolve_precision
    from trainer.sharded import open_loop

    spec = load_task_spec(TASK)
    source = open_source(spec)
    file = rollout_file(model_dir, work)
    rows = []
    for lr in lrs:
        config = LearnerConfig(lr=lr, warmup_steps=0, temperature=spec.sampling.temperature or 1.0)
        paths, precision = RunPaths(work / f"run-{lr:g}"), resolve_precision("cpu", "float32")
        loop = open_loop(model_dir, config, precision, spec, source, paths, World(),
                         rollouts_per_step=len(file.rows), max_files_per_step=1)  # fmt: skip
        results = {dtype: Row(label, dtype, lr) for dtype in DTYPES}
        snapshots: dict[str, list[Path]] = {dtype: [] for dtype in DTYPES}
        for step in range(steps + 1):
            if step:
                stats = loop.learner.train_step([file])
                if not stats.trained_tokens:
                    raise SystemExit(f"{label} lr {lr:g}: step {step} trained on no token")
            for dtype in DTYPES:
                path = published(loop.learner.model, dtype, work / f"{dtype}-{lr:g}-{step}.safetensors")
                snapshots[dtype].append(path)
                row = results[dtype]
                row.full = path.stat().st_size
                if not step:
                    continue
                before, delta, rebuilt = snapshots[dtype][-2], work / "delta", work / "rebuilt"
                started = time.perf_counter()
                encoded = encode_delta(before, path, delta)
                row.encode.append(time.perf_counter() - started)
                assert encoded is not None
                started = time.perf_counter()
                apply_delta(before, delta, rebuilt, size=path.stat().st_size)
                row.apply.append(time.perf_counter() - started)
                if rebuilt.read_bytes() != path.read_bytes():
                    raise SystemExit(f"{label} {dtype} lr {lr:g} step {step}: the rebuilt file differs")
                row.deltas.append(encoded.bytes)
                row.changed.append(encoded.changed_fraction)
                if save is not None and step == 1:
                    save_pair(model_dir, snapshots[dtype], save / f"{label}-{dtype}-{lr:g}")
                before.unlink() if step > 1 else None  # keep the first for the direct delta
        for dtype in DTYPES:
            direct = encode_delta(snapshots[dtype][0], snapshots[dtype][-1], work / "delta")
            assert direct is not None
            results[dtype].direct, results[dtype].direct_changed = direct.bytes, direct.changed_fraction
            for path in (snapshots[dtype][0], snapshots[dtype][-1]):
                path.unlink(missing_ok=True)
        rows += results.values()
        print(f"measured {label} at lr {lr:g}", file=sys.stderr, flush=True)
    return rows


@dataclasses.dataclass
class Spread:
    """One step's spread to N clients in one mode: medians over the repeats."""

    mode: str
    clients: int
    seconds: list[float] = dataclasses.field(default_factory=list)  # from published to the last client's exit
    publish: list[float] = dataclasses.field(default_factory=list)  # the origin's publish_start -> published
    moved: list[float] = dataclasses.field(default_factory=list)  # bytes each client downloaded (mean)
    apply: list[float] = dataclasses.field(default_factory=list)  # seconds each client spent applying (mean)
    relay_cpu: list[float] = dataclasses.field(default_factory=list)
    client_cpu: list[float] = dataclasses.field(default_factory=list)  # per client (mean)


def spread_once(pair: Path, mode: str, clients: int, work: Path, timeout: float, relay_rate: float) -> dict[str, float]:
    """Step 0 then step 1 of `pair` through an origin, a relay and `clients` clients; the second step measured. With
    `relay_rate` (MB/s), the relay serves at most that much to its clients together (`--client-rate`: they share the
    address 127.0.0.1): the uplink of a relay, or one worker's link when there is one client."""
    import os

    from benchmarks.shardcast import POOL, TRAINER, Processes, answers, free_port, in_flight
    from shardcast import trace
    from tests.anvil_deployment import write_anvil_deployment

    logs = work / "logs"
    logs.mkdir(parents=True)
    procs = Processes(logs, timeout)
    env = {trace.ENV: str(work / "trace")}
    deployment = write_anvil_deployment(work / "deployment.json")
    watch = work / "checkpoints"
    watch.mkdir()
    node = [sys.executable, "-m", "node.cli.main"]
    common = ["--host", "127.0.0.1", "--deployment", str(deployment)]
    try:
        origin_url = f"http://127.0.0.1:{(port := free_port())}"
        origin = [*node, "origin", "--data", str(work / "origin"), "--port", str(port), "--watch", str(watch)]
        origin += ["--pool", str(POOL), "--dev-key", "0", *common]
        origin += ["--delta-min-mib", "0"] if mode == "delta" else ["--no-delta"]
        procs.start("origin", origin, REPO, env)
        procs.wait_until("the origin", lambda: answers(f"{origin_url}/health"))
        relay_url = f"http://127.0.0.1:{(port := free_port())}"
        relay = [*node, "relay", "--data", str(work / "relay"), "--port", str(port), "--upstream", origin_url]
        relay += ["--client-rate", str(relay_rate)] if relay_rate else []
        procs.start("relay", [*relay, "--trainer", TRAINER, *common], REPO, env)
        procs.wait_until("the relay", lambda: answers(f"{relay_url}/health"))
        fetch = [*node, "fetch-weights", "--source", relay_url, "--trainer", TRAINER, "--pool", str(POOL), "--quiet"]
        fetch += ["--deployment", str(deployment)]
        for step, folder in enumerate(("step_0", "step_1"), start=1):
            names = [f"client-{i}-{step}" for i in range(clients)]
            for i, name in enumerate(names):
                procs.start(name, [*fetch, "--after", str(step - 1), "--out", str(work / f"client-{i}")], REPO, env)
            procs.wait_until("the clients' long-polls", lambda: in_flight(relay_url) > clients)
            if step == 2:  # a trainer's steps are seconds apart at least: the relay holds step 1 complete by then
                procs.wait_until("the relay's step 1", lambda: 1 in _complete(relay_url))
            staging = work / "staging" / f"step_{step}"
            staging.mkdir(parents=True)
            for file in (pair / folder).iterdir():
                os.link(file, staging / file.name)  # same file system: the checkpoint appears without a copy
            staging.rename(watch / f"step_{step}")
            procs.wait_for_line("origin", f"published step {step}", stream="err")
            published = time.time()
            procs.mark()
            finished = procs.wait_for_exits(names)
            for name in names:  # exited: their CPU figures stay in procs.cpu
                del procs.running[name]
        used = {name: cpu - procs.cpu_at_mark.get(name, 0.0) for name, cpu in procs.cpu.items()}
        procs.wait_until("the relay's step 2", lambda: 2 in _complete(relay_url))  # its trace complete, off the clock
    finally:
        procs.stop_all()
    want = (pair / "step_1" / "model.safetensors").read_bytes()
    for i in range(clients):
        if (work / f"client-{i}" / "step_2" / "model.safetensors").read_bytes() != want:
            raise SystemExit(f"{mode}, {clients} clients: client {i} holds other bytes than step_1")
    runs = trace.read(work / "trace")
    events = [e for run in runs.values() for e in run]
    relay_rebuilt = any(e["event"] == "rebuilt" for name, run in runs.items() if name.startswith("relay") for e in run)
    starts = [e["t"] for e in events if e["event"] == "publish_start" and e.get("step") == 2]
    done = [e["t"] for e in events if e["event"] == "published" and e.get("step") == 2]
    clients_events = [e for name, run in runs.items() if name.startswith("client") for e in run]
    rebuilt = [e for e in clients_events if e["event"] == "rebuilt" and e.get("step") == 2]
    fetched = [e for e in clients_events if e["event"] == "fetched" and e.get("step") == 2]
    if mode == "delta" and (len(rebuilt) != clients or not relay_rebuilt):
        raise SystemExit(f"delta, {clients} clients: {len(rebuilt)} clients (relay: {relay_rebuilt}) rebuilt step 2")
    size = sum(f.stat().st_size for f in (pair / "step_1").iterdir())
    if mode == "delta" and any(e["bytes"] < size / 2 for e in rebuilt):  # a full disk, say: see their logs
        raise SystemExit(f"delta, {clients} clients: a client rebuilt under half the step and fetched the rest whole")
    moved = sum(e["bytes"] for e in fetched) + sum(e["delta_bytes"] for e in rebuilt)
    return {
        "seconds": max(finished) - published,
        "publish": done[0] - starts[0],
        "moved": moved / clients,
        "apply": sum(e["apply_s"] for e in rebuilt) / clients,
        "relay_cpu": used["relay"],
        "client_cpu": sum(c for n, c in used.items() if n.startswith("client-") and n.endswith("-2")) / clients,
    }


def _complete(url: str) -> set[int]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"{url}/versions", timeout=10) as response:
        listing = json.loads(response.read())
    return {v["step"] for v in listing["versions"] if v["complete"]}


def propagate(pair: Path, counts: list[int], repeats: int, timeout: float, relay_rate: float) -> list[Spread]:
    import shutil

    spreads = []
    for clients in counts:
        for mode in ("whole", "delta"):
            spread = Spread(mode, clients)
            for repeat in range(repeats):
                work = Path(tempfile.mkdtemp(prefix=f"delta-spread-{mode}-{clients}-{repeat}-", dir=pair.parent))
                try:
                    got = spread_once(pair, mode, clients, work, timeout, relay_rate)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                for key, value in got.items():
                    getattr(spread, key).append(value)
                print(f"{mode}, {clients} clients, run {repeat + 1}: {got['seconds']:.2f} s", file=sys.stderr)
            spreads.append(spread)
    return spreads


def spread_table(pair: Path, spreads: list[Spread], relay_rate: float) -> None:
    med = statistics.median
    size = (pair / "step_1" / "model.safetensors").stat().st_size
    link = f"the relay serves at most {relay_rate:g} MB/s in all" if relay_rate else "loopback, no limit"
    print(f"{pair.name}: step_1 is {size / 1e6:,.1f} MB; {link}; medians of {len(spreads[0].seconds)} runs")
    print("| clients | mode | to the last client s | origin publish s | MB moved a client | apply s a client "
          "| relay CPU s | CPU s a client | all runs s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for s in spreads:
        runs = " ".join(f"{x:.2f}" for x in s.seconds)
        print(
            f"| {s.clients} | {s.mode} | {med(s.seconds):.2f} | {med(s.publish):.2f} | {med(s.moved) / 1e6:,.1f} | "
            f"{med(s.apply):.2f} | {med(s.relay_cpu):.2f} | {med(s.client_cpu):.2f} | {runs} |"
        )
    for clients in sorted({s.clients for s in spreads}):
        whole, delta = (next(s for s in spreads if (s.mode, s.clients) == (m, clients)) for m in ("whole", "delta"))
        handoff = (med(delta.seconds) + med(delta.publish)) / (med(whole.seconds) + med(whole.publish))
        print(
            f"{clients} clients: delta / whole time {med(delta.seconds) / med(whole.seconds):.2f}, "
            f"from the origin's hand-off {handoff:.2f}, bytes {med(delta.moved) / med(whole.moved):.3f}"
        )


def table(rows: list[Row], steps: int) -> None:
    print(
        f"| model | pool | lr | full MB | delta MB (mean of {steps}) | delta / full | words changed | encode s "
        f"| apply s | step 0 -> {steps}: one delta | chained |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mean = statistics.fmean(r.deltas)
        print(
            f"| {r.model} | {r.dtype} | {r.lr:g} | {r.full / 1e6:,.1f} | {mean / 1e6:,.2f} | {mean / r.full:.1%} | "
            f"{statistics.fmean(r.changed):.1%} | {statistics.fmean(r.encode):.2f} | {statistics.fmean(r.apply):.2f} | "
            f"{r.direct / r.full:.1%} ({r.direct_changed:.1%} changed) | {sum(r.deltas) / r.full:.1%} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="of the real shape's 24 (all: 24)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4])
    parser.add_argument("--skip-real", action="store_true", help="the tiny model only")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=DTYPES, help="the pools' precisions")
    parser.add_argument("--save", type=Path, help="keep steps 0 and 1 of each run as checkpoint folders here")
    parser.add_argument("--propagate", type=Path, help="time DIR/step_0 then DIR/step_1 through origin, relay, clients")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4], help="client counts for --propagate")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each --propagate measurement")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one --propagate run may take")
    parser.add_argument("--relay-rate", type=float, default=0.0, help="MB/s the relay serves in all (0: no limit)")
    args = parser.parse_args()
    if args.propagate:
        spreads = propagate(args.propagate, args.clients, args.repeats, args.timeout, args.relay_rate)
        spread_table(args.propagate, spreads, args.relay_rate)
        return
    DTYPES[:] = args.dtypes
    import torch

    from engine.model.shapes import QWEN25_05B
    from engine.model.tiny import init_model
    from protocol.tasks.spec import load_task_spec

    if args.threads:
        torch.set_num_threads(args.threads)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="delta-bench-") as tmp:
        work = Path(tmp)
        tiny = init_model(work / "tiny", seed=0)
        rows += measure("tiny", tiny, args.lrs, args.steps, work, args.save)
        if not args.skip_real:
            shape = dataclasses.replace(QWEN25_05B.with_layers(args.layers), dtype="float32")
            real = init_model(work / "real", seed=0, shape=shape, specs=[load_task_spec(TASK)])
            rows += measure(f"0.5b-{args.layers}l", real, args.lrs, args.steps, work, args.save)
    table(rows, args.steps)


if __name__ == "__main__":
    main()
