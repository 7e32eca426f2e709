#!/usr/bin/env bash
# Make a Docker engine reachable for the code sandbox (protocol/sandbox), idempotently.
#
#   scripts/ensure-docker.sh            # engine up? done. dockerd installed? start it. Otherwise fail.
#   scripts/ensure-docker.sh --install  # also install docker.io with apt-get when dockerd is missing (CI)
#
# Exit 0 once `docker info` answers; non-zero with one line saying what to do otherwise. `make test` may ignore
# the failure: tests marked `docker` then skip (and fail under CI=true, where the engine must exist).
set -euo pipefail

LOG=/tmp/prime-dockerd.log
WAIT_S=30
INSTALL=0

for arg in "$@"; do
    case "$arg" in
        --install) INSTALL=1 ;;
        -h | --help)
            sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "ensure-docker: unknown argument '$arg' (expected --install)" >&2
            exit 2
            ;;
    esac
done

fail() {
    echo "ensure-docker: $*" >&2
    exit 1
}

engine_up() {
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1
}

if engine_up; then
    exit 0
fi

as_root() {
    [ "$(id -u)" -eq 0 ]
}

if ! command -v dockerd >/dev/null 2>&1; then
    [ "$INSTALL" -eq 1 ] || fail "no Docker engine (dockerd not installed); install Docker, or run with --install as root"
    as_root || fail "installing docker.io needs root; run 'sudo $0 --install'"
    command -v apt-get >/dev/null 2>&1 || fail "dockerd missing and apt-get unavailable; install Docker by hand"
    echo "ensure-docker: installing docker.io with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || fail "apt-get update failed"
    apt-get install -y -qq --no-install-recommends docker.io >/dev/null 2>&1 ||
        fail "apt-get install docker.io failed (rerun 'apt-get install docker.io' to see why)"
    command -v dockerd >/dev/null 2>&1 || fail "docker.io installed but dockerd is still not on PATH"
fi

as_root || fail "dockerd is installed but not running; start it (e.g. 'sudo systemctl start docker') and rerun"

dockerd_alive() {
    [ -f /var/run/docker.pid ] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null
}

# Start the daemon unless one is already starting up (a second dockerd would fail on the pid file).
if ! dockerd_alive; then
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        systemctl start docker || fail "systemctl start docker failed (see 'journalctl -u docker')"
    else
        echo "ensure-docker: starting dockerd (log: $LOG)" >&2
        # setsid + nohup: the daemon outlives this script and the shell that ran it.
        setsid nohup dockerd >"$LOG" 2>&1 </dev/null &
    fi
fi

for _ in $(seq 1 "$WAIT_S"); do
    if engine_up; then
        exit 0
    fi
    sleep 1
done
fail "dockerd did not answer 'docker info' within ${WAIT_S} s; see $LOG"
