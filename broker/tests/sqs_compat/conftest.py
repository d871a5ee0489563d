"""Fixtures of the SQS compatibility suite: one real `sluiced` (built by cargo, path in
SLUICE_BIN) on a free port with a temporary data dir and SigV4 verification on, so that every
request of boto3, the AWS CLI and the raw Query client is signature-checked; fresh queues per
test (unique names)."""

import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET

import boto3
import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.httpsession
import pytest
from botocore.config import Config

ACCESS_KEY = "AKIDSLUICECOMPAT"
SECRET_KEY = "sluice-compat-secret"
ACCOUNT = "000000000000"
REGION = "us-east-1"
# Two more tenants for the isolation tests: (access key, secret, account).
TENANT_A = ("AKIDTENANTA", "tenant-a-secret", "111111111111")
TENANT_B = ("AKIDTENANTB", "tenant-b-secret", "222222222222")
NS = "{https://queue.amazonaws.com/doc/2012-11-05/}"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def endpoint():
    binary = os.environ.get("SLUICE_BIN")
    if not binary or not os.path.exists(binary):
        pytest.fail("SLUICE_BIN must name a built sluiced binary (ci/test.sh sets it)")
    data = tempfile.mkdtemp(prefix="sluice-compat-")
    port = _free_port()
    env = dict(
        os.environ,
        SLUICE_AUTH="sigv4",
        SLUICE_ACCESS_KEYS=",".join(
            ":".join(k) for k in [(ACCESS_KEY, SECRET_KEY, ACCOUNT), TENANT_A, TENANT_B]
        ),
        RUST_LOG="warn",
    )
    log = open(os.path.join(data, "sluiced.log"), "wb")
    proc = subprocess.Popen(
        [
            binary,
            "--data-dir", os.path.join(data, "d"),
            "--shards", "2",
            "--http-addr", f"127.0.0.1:{port}",
            "--quic-addr", f"127.0.0.1:{_free_port()}",
            "--metrics-addr", f"127.0.0.1:{_free_port()}",
            "--no-kafka",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("sluiced did not start: " + open(log.name, "rb").read().decode(errors="replace"))
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="session")
def sqs(endpoint):
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(retries={"max_attempts": 1}, read_timeout=40),
    )


def tenant_client(endpoint, tenant):
    akid, secret, _ = tenant
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=akid,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, read_timeout=40),
    )


@pytest.fixture(scope="session")
def sqs_a(endpoint):
    return tenant_client(endpoint, TENANT_A)


@pytest.fixture(scope="session")
def sqs_b(endpoint):
    return tenant_client(endpoint, TENANT_B)


@pytest.fixture
def name():
    """A fresh queue name per test."""
    return "t-" + uuid.uuid4().hex[:20]


class QueryClient:
    """The Query protocol (form-encoded, XML), signed with botocore's SigV4 signer."""

    def __init__(self, endpoint, secret=SECRET_KEY, access_key=ACCESS_KEY):
        self.endpoint = endpoint
        self.creds = botocore.credentials.Credentials(access_key, secret)
        self.http = botocore.httpsession.URLLib3Session()

    def call(self, action, params=None, path="/", presign=False):
        form = {"Action": action, "Version": "2012-11-05", **(params or {})}
        if presign:
            req = botocore.awsrequest.AWSRequest(method="GET", url=self.endpoint + path, params=form)
            botocore.auth.SigV4QueryAuth(self.creds, "sqs", REGION, expires=60).add_auth(req)
        else:
            req = botocore.awsrequest.AWSRequest(
                method="POST",
                url=self.endpoint + path,
                data=form,
                headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
            )
            botocore.auth.SigV4Auth(self.creds, "sqs", REGION).add_auth(req)
        resp = self.http.send(req.prepare())
        return resp.status_code, ET.fromstring(resp.content)


@pytest.fixture(scope="session")
def query(endpoint):
    return QueryClient(endpoint)


@pytest.fixture(scope="session")
def cli(endpoint):
    def run(*args, ok=True):
        env = dict(
            os.environ,
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_DEFAULT_REGION=REGION,
            AWS_CONFIG_FILE="/dev/null",
            AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        )
        aws = os.path.join(os.path.dirname(__import__("sys").executable), "aws")
        if not os.path.exists(aws):
            aws = "aws"
        p = subprocess.run(
            [aws, "--endpoint-url", endpoint, "--output", "json", "sqs", *args],
            env=env, capture_output=True, text=True, timeout=60,
        )
        if ok:
            assert p.returncode == 0, p.stderr
        return p
    return run
