#!/bin/sh
# Install what the emulated rack needs: iproute2 (`ip`, `tc`); with --ssh also OpenSSH
# (`sshd`, `ssh`, `ssh-keygen`) for the emulated machines of benchmarks/rack/machines.py.
# Idempotent; needs root to install anything. The package is installed only: no ssh service
# is started or enabled by this script (the rack runs its own sshd per emulated host).
set -eu

want_ssh=0
[ "${1:-}" = "--ssh" ] && want_ssh=1

missing=""
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
    missing="iproute2"
fi
if [ "$want_ssh" = 1 ]; then
    if [ ! -x /usr/sbin/sshd ]; then missing="$missing openssh-server"; fi
    if ! command -v ssh >/dev/null 2>&1 || ! command -v ssh-keygen >/dev/null 2>&1; then
        missing="$missing openssh-client"
    fi
fi

if [ -z "$missing" ]; then
    echo "rack deps: already present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "rack deps: missing$missing... and not root; run: sudo sh $0 $*" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "rack deps: apt-get not available; install by hand:$missing" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Debian's maintainer scripts must not start a system-wide sshd on the machine.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -q --no-install-recommends $missing || {
    apt-get update -q && apt-get install -y -q --no-install-recommends $missing
}

command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1
if [ "$want_ssh" = 1 ]; then [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1; fi
echo "rack deps: installed$missing"
