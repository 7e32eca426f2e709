# The worker image: `docker run IMAGE --pool N ...` runs `prime-node start --pool N ...`; `docker run IMAGE prime-node
# --help` (or any other command) runs that command instead. See docs/worker-image.md.
#
#   docker build -t prime-node-worker .                                  CPU: torch from the PyTorch CPU index
#   docker build --build-arg VARIANT=gpu -t prime-node-worker:gpu .     GPU: PyPI's CUDA torch and vLLM
#
# Where no registry is reachable, scripts/build-worker-image.sh builds it on a base imported from local Debian
# packages and passes a wheelhouse built on the host in `wheels/`; then nothing is fetched or compiled here.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
# Marks the build stage's image, which the classic builder leaves untagged, so scripts can find superseded ones.
LABEL prime-node-worker-build=1
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
# The CPU variant's torch source: PyPI's torch for Linux is the CUDA build, several GB this image must never hold.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Compilers for what is built from source: toploc against torch (its wheel fails to import with it), fastecdsa.
ARG BUILD_PACKAGES="g++ libgmp-dev"

# `wheel[s]` may match nothing (a plain `docker build .`); .dockerignore, which rarely changes, is listed so that the
# COPY always has a source.
COPY .dockerignore wheel[s] /wheels/
# With wheels, pip reads only them. Without, it reads the indexes and never takes toploc's published wheel.
RUN set -eu; \
    case "$VARIANT" in cpu | gpu) ;; *) echo "VARIANT=$VARIANT: choose cpu or gpu" >&2; exit 1 ;; esac; \
    python3 -m venv /opt/prime-node; \
    set -- /wheels/*.whl; \
    if [ -e "$1" ]; then \
        printf '[global]\nno-index = true\nfind-links = /wheels\n' >/opt/prime-node/pip.conf; \
    else \
        printf '[global]\nno-binary = toploc\n' >/opt/prime-node/pip.conf; \
        if [ -n "$BUILD_PACKAGES" ]; then \
            apt-get update; \
            apt-get install -y --no-install-recommends $BUILD_PACKAGES; \
            rm -rf /var/lib/apt/lists/*; \
        fi; \
    fi
ENV PATH=/opt/prime-node/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# Dependencies before sources, heaviest first, so that a change to the code reuses every layer above it.
RUN if [ "$VARIANT" = cpu ]; then index="$TORCH_INDEX_URL"; else index=https://pypi.org/simple; fi; \
    pip install --index-url "$index" "torch==$TORCH_VERSION" \
    && pip install setuptools wheel
RUN pip install --no-build-isolation toploc==0.1.6
COPY pyproject.toml /tmp/
RUN python3 -c 'import sys, tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; \
extra = p["optional-dependencies"]["gpu"] if sys.argv[1] == "gpu" else []; print("\n".join(p["dependencies"] + extra))' \
    "$VARIANT" >/tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /opt/prime-node/pip.conf

FROM ${BASE}
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="prime-node worker" \
      org.opencontainers.image.description="prime-node start: the worker daemon ($VARIANT)"
# An unprivileged user; /data is its working directory (deployment.json, keystore, state) and a volume.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/prime --shell /bin/sh prime \
    && mkdir /data \
    && chown prime:prime /data
COPY --from=build /opt/prime-node /opt/prime-node
ENV PATH=/opt/prime-node/bin:$PATH \
    PYTHONUNBUFFERED=1

# The sources last, in this stage, so that a code change rebuilds only these small layers. Editable, from /app:
# ledger reads the contract artifacts from <repository>/contracts/artifacts, next to its package.
COPY contracts/artifacts /app/contracts/artifacts
COPY configs /app/configs
COPY ledger /app/ledger
COPY node /app/node
COPY trainer /app/trainer
COPY validator /app/validator
COPY pyproject.toml README.md /app/
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation -e /app \
    && python3 -m compileall -q /app/ledger /app/node /app/trainer /app/validator
USER prime
WORKDIR /data
VOLUME /data
# A first argument that is an option (or none at all) goes to `prime-node start`; anything else is a command.
ENTRYPOINT ["/bin/sh", "-c", "case \"${1:-}\" in ''|-*) set -- prime-node start \"$@\" ;; esac; exec \"$@\"", "entrypoint"]
CMD []
