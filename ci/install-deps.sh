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

# The Kafka compatibility suite's kafkajs admin tests (broker/tests/kafka_compat/test_admin.py
# runs node scripts from broker/tests/kafka_compat/js/): Node from Debian when missing, kafkajs
# from the npm registry into target/node (kept out of git; installed only when missing).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm
fi
KAFKAJS_VERSION=2.2.4
if [ "$(node -p "require('./target/node/node_modules/kafkajs/package.json').version" 2>/dev/null)" != "$KAFKAJS_VERSION" ]; then
  mkdir -p target/node
  npm install --silent --no-audit --no-fund --no-save --prefix target/node "kafkajs@$KAFKAJS_VERSION"
fi
