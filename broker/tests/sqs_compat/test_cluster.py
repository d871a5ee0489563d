"""boto3 and the AWS CLI against a three-node cluster (`sluice dev cluster --prepare-only` lays
out the nodes; each `sluiced` is started here so that one can be killed): pointed at one node
that does not lead the queue, they keep working while the leader is killed with SIGKILL, with
nothing but their own standard retries (a 503 during the election), and every message they
sent is received. SigV4 is on: a forwarded request keeps the signed Host header."""

import json
import os
import signal
import subprocess
import time
import urllib.request

import boto3
import pytest
from botocore.config import Config

from conftest import ACCESS_KEY, ACCOUNT, REGION, SECRET_KEY

READY_TIMEOUT_S = 120
SENDS = 15


def _ready(metrics_addr):
    try:
        with urllib.request.urlopen(f"http://{metrics_addr}/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def cluster(tmp_path):
    cli = os.environ.get("SLUICE_CLI")
    binary = os.environ.get("SLUICE_BIN")
    if not cli or not os.path.exists(cli) or not binary:
        pytest.fail("SLUICE_CLI and SLUICE_BIN must name the built sluice and sluiced (ci/test.sh)")
    out = subprocess.run(
        [cli, "--output", "json", "dev", "cluster", "--nodes", "3", "--shards", "1",
         "--dir", str(tmp_path / "cluster"), "--prepare-only"],
        capture_output=True, check=True, timeout=60,
    )
    nodes = json.loads(out.stdout)
    env = dict(
        os.environ,
        SLUICE_AUTH="sigv4",
        SLUICE_ACCESS_KEYS=f"{ACCESS_KEY}:{SECRET_KEY}:{ACCOUNT}",
        RUST_LOG="warn",
    )
    procs = {}
    for n in nodes:
        log = open(n["log"], "ab")
        procs[n["node_id"]] = subprocess.Popen(
            [binary, "--config", n["config"]], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    deadline = time.time() + READY_TIMEOUT_S
    for n in nodes:
        while not _ready(n["metrics_addr"]):
            if time.time() > deadline or procs[n["node_id"]].poll() is not None:
                pytest.fail(f"node {n['node']} not ready: " + open(n["log"]).read()[-3000:])
            time.sleep(0.1)
    yield nodes, procs
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _client(node):
    # The SDK's own standard retries, as an application would configure them.
    return boto3.client(
        "sqs",
        endpoint_url=f"http://{node['http_addr']}",
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(retries={"max_attempts": 10, "mode": "standard"}, read_timeout=40),
    )


def _aws(node, *args):
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION=REGION,
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        AWS_RETRY_MODE="standard",
        AWS_MAX_ATTEMPTS="10",
    )
    aws = os.path.join(os.path.dirname(__import__("sys").executable), "aws")
    if not os.path.exists(aws):
        aws = "aws"
    out = subprocess.run(
        [aws, "--endpoint-url", f"http://{node['http_addr']}", "--output", "json", "sqs", *args],
        capture_output=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    return json.loads(out.stdout or b"{}")


def test_boto3_and_the_aws_cli_keep_working_while_the_leader_dies(cluster):
    nodes, procs = cluster
    first = _client(nodes[0])
    url = first.create_queue(QueueName="failover")["QueueUrl"]
    r = first.send_message(QueueUrl=url, MessageBody="first")
    leader = int(r["ResponseMetadata"]["HTTPHeaders"]["x-sluice-node"])
    other = next(n for n in nodes if n["node_id"] != leader)
    sqs = _client(other)
    sent = {"first"}
    for i in range(SENDS):
        sqs.send_message(QueueUrl=url, MessageBody=f"before-{i}")
        sent.add(f"before-{i}")
    procs[leader].kill()
    procs[leader].wait()
    for i in range(SENDS):
        r = sqs.send_message(QueueUrl=url, MessageBody=f"after-{i}")
        assert int(r["ResponseMetadata"]["HTTPHeaders"]["x-sluice-node"]) != leader
        sent.add(f"after-{i}")
    _aws(other, "send-message", "--queue-url", url, "--message-body", "from-the-cli")
    sent.add("from-the-cli")
    got = set()
    empty = 0
    while empty < 2:
        msgs = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
        empty = empty + 1 if not msgs else 0
        for m in msgs:
            got.add(m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert sent <= got, f"sent but never received: {sorted(sent - got)}"
    attrs = _aws(other, "get-queue-attributes", "--queue-url", url, "--attribute-names", "All")
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"
