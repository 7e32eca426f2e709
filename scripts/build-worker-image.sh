#!/usr/bin/env bash
# Build the worker image where no image registry is reachable, and print its tag (node/worker_image.py).
#
#   scripts/build-worker-image.sh    # prime-node-worker:cpu-<hash>; seconds when nothing changed since the last build
#
# A base imported from local Debian packages, a wheelhouse built here with this machine's pip sources, then
# `docker build`. With a registry, `docker build -t prime-node-worker .` does the same from python:3.11-slim.
# Needs the project's venv (`make install`) and a Docker engine (scripts/ensure-docker.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

case "${1:-}" in
    -h | --help)
        sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    "") ;;
    *)
        echo "build-worker-image: unknown argument '$1'" >&2
        exit 2
        ;;
esac

[ -x "$ROOT/.venv/bin/python" ] || {
    echo "build-worker-image: no venv at $ROOT/.venv; run 'make install' first" >&2
    exit 1
}
cd "$ROOT"
exec .venv/bin/python -m node.worker_image
