#!/usr/bin/env bash
# A Debian-packaged program that some tests run, on PATH: Chromium for the dashboard tests, promtool (in Debian's
# prometheus) for the /metrics pages.
#
#   scripts/ensure-tool.sh [--install] PACKAGE COMMAND...
#
# Exit 0 once one of the COMMANDs answers --version. Otherwise, with --install (root), install PACKAGE with apt-get
# first; without, fail with one line saying what to do. `make test` may ignore the failure: those tests then skip
# (and fail under CI=true, where the program must exist).
set -euo pipefail

INSTALL=0
if [ "${1:-}" = "--install" ]; then
    INSTALL=1
    shift
fi
if [ $# -lt 2 ] || [ "${1#-}" != "$1" ]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
PACKAGE=$1
shift

fail() {
    echo "ensure-tool: $*" >&2
    exit 1
}

found() {
    for name in "$@"; do
        if command -v "$name" >/dev/null 2>&1 && "$name" --version >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

if found "$@"; then
    exit 0
fi
[ "$INSTALL" -eq 1 ] || fail "no $1 on PATH; install Debian's $PACKAGE, or run with --install as root"
[ "$(id -u)" -eq 0 ] || fail "installing $PACKAGE needs root; run 'sudo $0 --install $PACKAGE $*'"
command -v apt-get >/dev/null 2>&1 || fail "$1 missing and apt-get unavailable; install $PACKAGE by hand"
echo "ensure-tool: installing $PACKAGE with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || fail "apt-get update failed"
apt-get install -y -qq --no-install-recommends "$PACKAGE" >/dev/null 2>&1 ||
    fail "apt-get install $PACKAGE failed (rerun 'apt-get install $PACKAGE' to see why)"
found "$@" || fail "$PACKAGE installed but $1 does not start ('$1 --version' fails)"
