#!/usr/bin/env bash
# C headers that Python packages without a wheel for this platform compile against, installed when missing.
#
# fastecdsa (pulled in by libp2p for p2p) builds from source and needs GMP's headers (Debian: libgmp-dev).
# As root with apt-get, the package is installed; otherwise one line says what to install, and pip's own
# error follows if it is really missing.
set -euo pipefail

if [ -e /usr/include/gmp.h ] || [ -e /usr/include/x86_64-linux-gnu/gmp.h ] || [ -e /usr/include/aarch64-linux-gnu/gmp.h ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgmp-dev >/dev/null
    exit 0
fi
echo "GMP headers missing: install libgmp-dev (Debian/Ubuntu) or gmp-devel (Fedora) before 'make install'" >&2
exit 1
