#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine (idempotent; Debian packages).
set -euo pipefail
missing=()
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# The Kafka compatibility suite (broker/tests/kafka_compat) drives kcat (librdkafka).
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
# The perf suite's Kafka target (`sluice-perf --features kafka`) links the system's librdkafka.
pkg-config --exists rdkafka 2>/dev/null || missing+=(librdkafka-dev pkg-config)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy

# The SQS compatibility suite (broker/tests/sqs_compat): boto3, the AWS CLI and pytest from PyPI
# in a venv under target/ (kept out of git, rebuilt when missing); the Kafka one
# (broker/tests/kafka_compat): kafka-python and confluent-kafka (wheels bundle librdkafka).
cd "$(dirname "$0")/.."
VENV=target/py-venv
if ! "$VENV/bin/python" -c 'import boto3, botocore, pytest' >/dev/null 2>&1 || [ ! -x "$VENV/bin/aws" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet boto3 awscli pytest
fi
if ! "$VENV/bin/python" -c 'import kafka, confluent_kafka' >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet kafka-python confluent-kafka
fi

# The dashboards and alerts test (dashboards/tests): a real Prometheus scrapes a real sluiced,
# and promtool (shipped in Debian's prometheus package) checks and unit-tests the alert rules.
# Without recommends: the node exporter is not wanted. The package's service is not used (the
# test starts its own Prometheus on a free loopback port, its data in a temporary directory).
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus
  # Under systemd the package starts a Prometheus on :9090 scraping nothing of ours: stop it.
  if [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
if ! "$VENV/bin/python" -c 'import requests, yaml' >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet requests pyyaml
fi
# The web console's browser suite (broker/tests/console): a real headless Chromium driven over
# WebDriver by selenium (from PyPI, in the same venv). Debian's chromium and chromium-driver;
# selenium is given both paths, so it never downloads a browser or a driver of its own.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver
fi
if ! "$VENV/bin/python" -c 'import selenium' >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet selenium
fi
# Compressed Kafka batches (broker/tests/kafka_compat/test_compression.py): kafka-python's
# codecs (cramjam for snappy, lz4, zstandard) and aiokafka, in the same venv.
if ! "$VENV/bin/python" -c 'import aiokafka, cramjam, lz4.frame, zstandard' >/dev/null 2>&1; then
  "$VENV/bin/pip" install --quiet aiokafka cramjam python-snappy lz4 zstandard
fi
# ... and kafkajs from the npm registry under target/ (kept out of git), with codec packages
# that need no download beyond npm and no native build: kafkajs-snappy (snappyjs, pure JS),
# lz4js (pure JS) and @bokuweb/zstd-wasm (WebAssembly shipped in the package). The suite
# registers lz4js and zstd-wasm as kafkajs' codecs itself (kafkajs_compat.js): kafkajs-lz4 wraps
# the `lz4` native addon, and @kafkajs/zstd is a native addon that downloads a prebuilt binary.
if ! command -v npm >/dev/null 2>&1; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi
NODE_DIR=target/node-kafka
if ! (cd "$NODE_DIR" 2>/dev/null && node -e 'for (const m of ["kafkajs","kafkajs-snappy","lz4js","@bokuweb/zstd-wasm"]) require.resolve(m)') >/dev/null 2>&1; then
  mkdir -p "$NODE_DIR"
  [ -f "$NODE_DIR/package.json" ] || echo '{"name":"sluice-kafka-compat","private":true}' > "$NODE_DIR/package.json"
  (cd "$NODE_DIR" && npm install --silent --no-audit --no-fund \
    kafkajs@2.2.4 kafkajs-snappy@1.1.0 lz4js@0.2.0 @bokuweb/zstd-wasm@0.0.27)
fi
# --- Kafka port security (broker/tests/kafka_compat/test_security.py): openssl makes the test
# CA and client certificate; kafkajs (from the npm registry, pinned) logs in with SCRAM over
# TLS. Installed under target/kafkajs (kept out of git); the test finds it there or in
# $SLUICE_KAFKAJS_DIR.
sec_missing=()
command -v openssl >/dev/null 2>&1 || sec_missing+=(openssl)
command -v node >/dev/null 2>&1 || sec_missing+=(nodejs)
command -v npm >/dev/null 2>&1 || sec_missing+=(npm)
if [ ${#sec_missing[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${sec_missing[@]}"
fi
if [ ! -f target/kafkajs/node_modules/kafkajs/package.json ]; then
  mkdir -p target/kafkajs
  npm install --silent --no-audit --no-fund --prefix target/kafkajs kafkajs@2.2.4
fi
# The kafkajs admin tests (broker/tests/kafka_compat/test_admin.py, node scripts in
# broker/tests/kafka_compat/js/) load kafkajs from target/node.
KAFKAJS_VERSION=2.2.4
if [ "$(node -p "require('./target/node/node_modules/kafkajs/package.json').version" 2>/dev/null)" != "$KAFKAJS_VERSION" ]; then
  mkdir -p target/node
  npm install --silent --no-audit --no-fund --no-save --prefix target/node "kafkajs@$KAFKAJS_VERSION"
fi
# --- Network faults of the fault harness (chaos/src/net.rs, chaos/tests/net.rs): `ip` (iproute2)
# builds the test's network namespaces and veth links, `nft` (nftables) drops traffic for
# partitions and random loss inside them. The kernel here has no netem, so nothing else is used.
net_missing=()
command -v ip >/dev/null 2>&1 || net_missing+=(iproute2)
command -v nft >/dev/null 2>&1 || net_missing+=(nftables)
if [ ${#net_missing[@]} -gt 0 ]; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${net_missing[@]}"
fi
