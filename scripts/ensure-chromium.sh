#!/usr/bin/env bash
# Headless Chromium for the dashboard tests (tests/node/test_dashboard.py, tests/validator/test_validator_dashboard.py).
#
#   scripts/ensure-chromium.sh            # chromium on PATH? done. Otherwise fail with what to do.
#   scripts/ensure-chromium.sh --install  # also install Debian's chromium with apt-get when it is missing (root)
#
# Exit 0 once a chromium binary answers --version; non-zero with one line saying what to do otherwise. `make test`
# may ignore the failure: the dashboard tests then skip (and fail under CI=true, where the browser must exist).
set -euo pipefail

INSTALL=0
for arg in "$@"; do
    case "$arg" in
        --install) INSTALL=1 ;;
        -h | --help)
            sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "ensure-chromium: unknown argument '$arg' (expected --install)" >&2
            exit 2
            ;;
    esac
done

fail() {
    echo "ensure-chromium: $*" >&2
    exit 1
}

found() {
    for name in chromium chromium-browser google-chrome; do
        if command -v "$name" >/dev/null 2>&1 && "$name" --version >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

if found; then
    exit 0
fi
[ "$INSTALL" -eq 1 ] || fail "no chromium on PATH; install Debian's chromium, or run with --install as root"
[ "$(id -u)" -eq 0 ] || fail "installing chromium needs root; run 'sudo $0 --install'"
command -v apt-get >/dev/null 2>&1 || fail "chromium missing and apt-get unavailable; install Chromium by hand"
echo "ensure-chromium: installing chromium with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || fail "apt-get update failed"
apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 ||
    fail "apt-get install chromium failed (rerun 'apt-get install chromium' to see why)"
found || fail "chromium installed but it does not start ('chromium --version' fails)"
