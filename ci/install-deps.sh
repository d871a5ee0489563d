#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine (idempotent; Debian packages).
set -euo pipefail
missing=()
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy
