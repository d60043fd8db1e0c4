#!/bin/sh
# Install what the emulated rack needs (iproute2: `ip`, `tc`). Idempotent; needs root.
set -eu

if command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1; then
    echo "rack deps: ip and tc already present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "rack deps: ip/tc missing and not root; run: sudo sh $0" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "rack deps: ip/tc missing and apt-get not available; install iproute2 by hand" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends iproute2

command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1
echo "rack deps: installed iproute2"
