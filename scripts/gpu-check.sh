#!/usr/bin/env bash
# The GPU checks of issue 20, as one run of at most 8 minutes on one lent GPU (benchmarks/gpu_check.py says what).
#
#   scripts/gpu-check.sh prepare     # here, with the network: the wheels the GPU machine lacks, into .whl/
#   scripts/gpu-check.sh             # there (carry .whl): install them beside its torch, run, figures in $OUT
#   scripts/gpu-check.sh --dry-run   # here: the same program with the CPU standing in for CUDA
#
# The GPU machine has Python 3.12, torch 2.11 with CUDA, transformers, pyarrow, aiohttp, rich and typer, no vLLM
# and no network: what the project imports beyond that travels as Python 3.12 wheels, toploc as its source,
# compiled there against that torch (its wheels are built against one torch and fail to import with another).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$ROOT/.whl"
# What the GPU machine's image lacks of the modules benchmarks/gpu_check.py imports, pinned as `make install` has them.
PACKAGES=(
    "reasoning-gym==0.1.25"
    "eth-account==0.13.7"
)
TOPLOC="toploc==0.1.6"
LIMIT_S=480

case "${1:-run}" in
    -h | --help)
        sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
        ;;
    prepare)
        mkdir -p "$WHEELS"
        grep -qxF '/.whl/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.whl/' >>"$ROOT/.git/info/exclude"
        python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d "$WHEELS" "${PACKAGES[@]}"
        python3 -m pip download --quiet --no-deps --no-binary=:all: -d "$WHEELS" "$TOPLOC"
        du -sh "$WHEELS"
        ;;
    --dry-run)
        cd "$ROOT"
        OUT="${OUT:-$(mktemp -d)}"
        PYTHONUNBUFFERED=1 .venv/bin/python benchmarks/gpu_check.py --device cpu --files 2 --sizes tiny \
            --batches 1,16 --out "$OUT"
        ;;
    run)
        cd "$ROOT"
        OUT="${OUT:-$ROOT/gpu-check-out}"
        mkdir -p "$OUT"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
        # the machine's own torch stays: a wheel here that needs another torch would replace it, so none does
        if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
            python3 -m pip install -q --no-index --no-compile --no-cache-dir --find-links "$WHEELS" \
                --target /tmp/site "${PACKAGES[@]}" 2>&1 | tee "$OUT/install.log"
        fi
        export PYTHONPATH="/tmp/site:$ROOT"
        python3 -c 'import toploc' 2>/dev/null \
            || python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
                "$WHEELS"/toploc-*.tar.gz 2>&1 | tail -5 | tee -a "$OUT/install.log"
        set -o pipefail
        PYTHONUNBUFFERED=1 timeout "$LIMIT_S" python3 benchmarks/gpu_check.py --device cuda --out "$OUT" \
            2>&1 | tee "$OUT/gpu-check.log"
        ;;
    *)
        echo "gpu-check: unknown argument '$1' (prepare, --dry-run, or none)" >&2
        exit 2
        ;;
esac
