"""The sandbox image: a Python interpreter and its standard library, nothing else (no shell, no package manager,
no compiler), imported with `docker import` from a root filesystem assembled on this machine.

No image registry is reachable from our machines, so nothing is pulled. The root is assembled one of two ways:

- apt (preferred): `apt-get download` the Debian packages in `APT_PACKAGES` and unpack them with `dpkg -x`;
  the same package versions give the same bytes on every machine that uses the same mirror.
- host (fallback, when apt is missing or fails): copy this machine's `/usr/bin/python3.11`, its standard library
  and every shared library `ldd` lists for it and its extension modules.

Both add `/etc/passwd` with the unprivileged user `nobody` (uid 65534) that every sandboxed program runs as, a
`/tmp` mount point, and precompiled bytecode (startup about 0.1 s faster per run). The tag,
`prime-sandbox:py311-<hash8>`, hashes the recipe (method, package files with their sha256, or the host
interpreter's bytes), so an image is built once and reused until its inputs change.
"""

from __future__ import annotations

import compileall
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from protocol.sandbox.errors import SandboxImageError

if TYPE_CHECKING:
    import docker

logger = logging.getLogger(__name__)

RECIPE_VERSION = "1"  # bump whenever the assembly below changes what lands in the image
REPOSITORY = "prime-sandbox"
IMAGE_LABEL = "prime-sandbox-image"
APT_PACKAGES = (
    "python3.11-minimal",  # the interpreter
    "libpython3.11-minimal",  # the core standard library (os, re, encodings, ...)
    "libpython3.11-stdlib",  # the rest (json, heapq, fractions, decimal, ...)
    "libc6",
    "zlib1g",
    "libexpat1",
    "libffi8",  # ctypes
    "libbz2-1.0",
    "liblzma5",
)  # libssl3 is left out: hashlib falls back to its built-in digests, and it would add 5 MB
APT_PYTHON = "/usr/bin/python3.11"
HOST_PYTHON = "/usr/bin/python3.11"
PRUNE = (  # paths (globs) under the root that no program needs: docs, iconv modules, tests, GUI, installers
    "usr/share",
    "usr/lib/*/gconv",
    "etc/ld.so.conf.d",
    "usr/lib/python3*/test",
    "usr/lib/python3*/idlelib",
    "usr/lib/python3*/tkinter",
    "usr/lib/python3*/turtledemo",
    "usr/lib/python3*/pydoc_data",
    "usr/lib/python3*/ensurepip",
    "usr/lib/python3*/lib2to3",
    "usr/lib/python3*/config-*",
    "usr/lib/python3*/lib-dynload/_test*",
    "usr/lib/python3*/lib-dynload/xx*",
)
PASSWD = "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
CHANGES = (
    "ENV PATH=/usr/bin:/bin",
    "ENV LANG=C.UTF-8",
    "USER 65534:65534",
    "WORKDIR /tmp",
    f"LABEL {IMAGE_LABEL}=1",
)
Method = Literal["auto", "apt", "host"]
_URI_LINE = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+\.deb) (?P<size>\d+) SHA256:(?P<sha>[0-9a-f]{64})$")


@dataclass(frozen=True)
class Recipe:
    """What goes into an image. `inputs` pins it: "file sha256" per .deb, or the host interpreter's identity."""

    method: Literal["apt", "host"]
    python: str  # absolute path of the interpreter inside the image
    version: str  # "3.11"
    inputs: tuple[str, ...]

    @property
    def tag(self) -> str:
        text = json.dumps([RECIPE_VERSION, self.method, self.python, self.version, self.inputs])
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
        return f"{REPOSITORY}:py{self.version.replace('.', '')}-{digest}"


_built: dict[tuple[str, str], str] = {}
_lock = threading.Lock()


def ensure_sandbox_image(client: docker.DockerClient, *, method: Method = "auto") -> str:
    """The tag of the sandbox image, building it first if the engine does not have it yet.

    Cached per engine and method for the life of the process, so callers may call this before every run.
    """
    key = (str(client.api.base_url), method)
    with _lock:
        if key in _built:
            return _built[key]
        tag = _ensure(client, method)
        _built[key] = tag
        return tag


def _ensure(client: docker.DockerClient, method: Method) -> str:
    recipes: list[Recipe] = []
    if method in ("auto", "apt"):
        apt = apt_recipe()
        if apt is not None:
            recipes.append(apt)
        elif method == "apt":
            raise SandboxImageError("apt", "apt-get cannot resolve the packages (is apt installed and updated?)")
    if method in ("auto", "host"):
        recipes.append(host_recipe())
    for i, recipe in enumerate(recipes):
        if _has_image(client, recipe.tag):
            return recipe.tag
        try:
            return build_image(client, recipe)
        except SandboxImageError as exc:
            if i == len(recipes) - 1:
                raise
            logger.warning("sandbox image via %s failed (%s); falling back to %s", recipe.method, exc, "host")
    raise SandboxImageError("recipe", f"no recipe for method {method!r}")  # unreachable: recipes is never empty


def apt_recipe() -> Recipe | None:
    """The apt recipe with the exact package files apt would fetch now, or None when apt cannot resolve them."""
    if shutil.which("apt-get") is None:
        return None
    try:
        out = _run(["apt-get", "download", "--print-uris", *APT_PACKAGES], step="apt-get download --print-uris")
    except SandboxImageError as exc:
        logger.info("apt recipe unavailable: %s", exc)
        return None
    files = sorted(f"{m['file']} {m['sha']}" for line in out.splitlines() if (m := _URI_LINE.match(line.strip())))
    if len(files) != len(APT_PACKAGES):
        logger.info("apt resolved %d of %d sandbox packages", len(files), len(APT_PACKAGES))
        return None
    return Recipe(method="apt", python=APT_PYTHON, version="3.11", inputs=tuple(files))


def host_recipe(python: str = HOST_PYTHON) -> Recipe:
    """The host recipe for an interpreter of this machine, pinned by its bytes and its standard library path."""
    exe = Path(python)
    if not exe.is_file():
        raise SandboxImageError("host", f"{python} not found (install python3.11, or apt for the apt recipe)")
    probe = "import sysconfig as s; print(s.get_python_version()); print(s.get_paths()['stdlib'])"
    version, stdlib = _run([python, "-I", "-c", probe], step=f"{python} -c").splitlines()[:2]
    digest = hashlib.sha256(exe.read_bytes()).hexdigest()
    return Recipe(method="host", python=str(exe), version=version, inputs=(f"{exe} {digest}", stdlib))


def build_image(client: docker.DockerClient, recipe: Recipe) -> str:
    """Assemble the recipe's root filesystem in a temporary directory and `docker import` it under its tag."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="prime-sandbox-") as tmp:
        work, root = Path(tmp), Path(tmp) / "root"
        root.mkdir()
        if recipe.method == "apt":
            _assemble_apt(recipe, root, work)
        else:
            _assemble_host(recipe, root)
        _finish_root(root, recipe)
        archive = work / "root.tar"
        _write_tar(root, archive)
        repository, tag = recipe.tag.split(":")
        try:
            client.api.import_image_from_file(str(archive), repository=repository, tag=tag, changes=list(CHANGES))
        except Exception as exc:  # docker raises APIError or requests' errors; both mean the same here
            raise SandboxImageError("docker import", str(exc)) from exc
    if not _has_image(client, recipe.tag):
        raise SandboxImageError("docker import", f"the engine does not list {recipe.tag} after importing it")
    size = client.images.get(recipe.tag).attrs.get("Size", 0)
    logger.info("built %s in %.1f s (%.1f MB)", recipe.tag, time.monotonic() - started, size / 1e6)
    return recipe.tag


def _assemble_apt(recipe: Recipe, root: Path, work: Path) -> None:
    _run(["apt-get", "download", "-q", *APT_PACKAGES], step="apt-get download", cwd=work)
    for entry in recipe.inputs:
        name, sha = entry.split()
        deb = work / name
        if not deb.is_file() or hashlib.sha256(deb.read_bytes()).hexdigest() != sha:
            raise SandboxImageError("apt-get download", f"{name} missing or not the file apt resolved (sha256)")
        _run(["dpkg", "-x", str(deb), str(root)], step=f"dpkg -x {name}")


def _assemble_host(recipe: Recipe, root: Path) -> None:
    exe, stdlib = Path(recipe.python), Path(recipe.inputs[1])
    _copy_file(exe, root)
    shutil.copytree(stdlib, _inside(root, stdlib), symlinks=True, ignore=shutil.ignore_patterns("site-packages"))
    binaries = [exe, *sorted(stdlib.glob("lib-dynload/*.so"))]
    for library in sorted({lib for binary in binaries for lib in _shared_libraries(binary)}):
        _copy_file(library, root)


def _shared_libraries(binary: Path) -> list[Path]:
    """Absolute paths `ldd` prints for a binary, the dynamic loader included."""
    out = _run(["ldd", str(binary)], step=f"ldd {binary.name}")
    paths = []
    for line in out.splitlines():
        match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if match:
            paths.append(Path(match.group(1)))
    return paths


def _finish_root(root: Path, recipe: Recipe) -> None:
    """Prune, add the users and /tmp, link python3, and precompile the standard library."""
    for pattern in PRUNE:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/passwd").write_text(PASSWD)
    (root / "etc/group").write_text(GROUP)
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    link = root / "usr/bin/python3"
    if not link.exists() and not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(recipe.python)
    if recipe.version == f"{sys.version_info.major}.{sys.version_info.minor}":
        # Same minor version, so the same bytecode magic: our interpreter's .pyc files load in the image's.
        stdlib = root / f"usr/lib/python{recipe.version}" if recipe.method == "apt" else _inside(root, recipe.inputs[1])
        ok = compileall.compile_dir(stdlib, ddir=_outside(root, stdlib), quiet=2, workers=0)
        if not ok:
            logger.info("some standard library modules did not precompile; they compile at import instead")


def _write_tar(root: Path, archive: Path) -> None:
    """A tar of the root in sorted order, owned by root: the same tree gives the same bytes."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted([*dirnames, *filenames]):
                path = Path(dirpath) / name
                tar.add(path, arcname=str(path.relative_to(root)), recursive=False, filter=owned_by_root)


def _copy_file(path: Path, root: Path) -> None:
    """Copy the file `path` resolves to into the root at `path` (symlinks become their target's bytes)."""
    target = _inside(root, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path.resolve(), target)


def _inside(root: Path, path: Path | str) -> Path:
    return root / str(path).lstrip("/")


def _outside(root: Path, path: Path) -> str:
    return "/" + str(path.relative_to(root))


def _has_image(client: docker.DockerClient, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _run(argv: list[str], *, step: str, cwd: Path | None = None) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxImageError(step, str(exc)) from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SandboxImageError(step, f"exit {done.returncode}: {tail[0]}")
    return done.stdout
