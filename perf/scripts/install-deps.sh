#!/usr/bin/env bash
# Installs what the perf suite measures against (Debian packages). Idempotent.
set -euo pipefail
need=()
command -v fio >/dev/null 2>&1 || need+=(fio)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
