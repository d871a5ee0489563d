#!/usr/bin/env bash
# Installs the peers the perf suite compares Sluice with (Debian packages): nats-server,
# rabbitmq-server (with its Erlang runtime) and redis-server. Idempotent. The packages' own
# system services are neither started nor left running: the suite starts its own instances on
# loopback, each with its own data directory and ports, and stops them when it is done.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/install-deps.sh"   # fio, the disk floor

if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
need=()
command -v kill >/dev/null 2>&1 || need+=(procps)   # the suite stops peers with kill(1)
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
{ command -v rabbitmq-server >/dev/null 2>&1 || [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; } \
  || need+=(rabbitmq-server)
[ ${#need[@]} -eq 0 ] && exit 0

# Keep the maintainer scripts from starting the system services: invoke-rc.d asks
# /usr/sbin/policy-rc.d, and 101 means "action not allowed". Ours is removed afterwards (an
# existing one is left as it was).
policy=/usr/sbin/policy-rc.d
ours=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  ours=1
fi
cleanup() { if [ -n "$ours" ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT

$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"

# Where systemd runs, the units may still have been enabled (and started) by the packages.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  for unit in nats-server redis-server rabbitmq-server epmd.socket epmd; do
    $SUDO systemctl disable --now "$unit" >/dev/null 2>&1 || true
  done
fi
