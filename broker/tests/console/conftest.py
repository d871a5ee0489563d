"""Fixtures of the web console's browser suite: real `sluiced` processes (built by cargo, path in
SLUICE_BIN) on free ports with temporary data dirs, and a real headless Chromium (Debian's
`chromium` and `chromium-driver`) driven over WebDriver by selenium.

Two brokers: `open_broker` with authentication off (the local default; Kafka listener on) and
`auth_broker` with SigV4 on and two tenants. Screenshots go to CONSOLE_SCREENSHOTS (default
target/console-screenshots under the repository)."""

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import boto3
import pytest
from botocore.config import Config

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SHOTS = os.environ.get("CONSOLE_SCREENSHOTS", os.path.join(REPO, "target", "console-screenshots"))
REGION = "us-east-1"
# (access key, secret, account) of the auth-on broker's two tenants.
TENANT_A = ("AKIDCONSOLEA", "console-a-secret", "111111111111")
TENANT_B = ("AKIDCONSOLEB", "console-b-secret", "222222222222")
# The longest any wait in the suite may take.
WAIT_S = 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, auth):
        binary = os.environ.get("SLUICE_BIN")
        if not binary or not os.path.exists(binary):
            pytest.fail("SLUICE_BIN must name a built sluiced binary (ci/test.sh sets it)")
        self.dir = tempfile.mkdtemp(prefix="sluice-console-")
        self.http_port, self.metrics_port, self.kafka_port = free_port(), free_port(), free_port()
        env = dict(os.environ, RUST_LOG="warn")
        if auth:
            env["SLUICE_AUTH"] = "sigv4"
            env["SLUICE_ACCESS_KEYS"] = ",".join(":".join(t) for t in (TENANT_A, TENANT_B))
        else:
            env["SLUICE_AUTH"] = "none"
            env.pop("SLUICE_ACCESS_KEYS", None)
        args = [
            binary,
            "--data-dir", os.path.join(self.dir, "d"),
            "--shards", "2",
            "--http-addr", f"127.0.0.1:{self.http_port}",
            "--quic-addr", f"127.0.0.1:{free_port()}",
            "--metrics-addr", f"127.0.0.1:{self.metrics_port}",
        ]
        args += ["--no-kafka"] if auth else ["--kafka-addr", f"127.0.0.1:{self.kafka_port}"]
        self.log = open(os.path.join(self.dir, "sluiced.log"), "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(self.console_base() + "/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                pytest.fail("sluiced did not start: " + open(self.log.name, "rb").read().decode(errors="replace"))
            time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{self.http_port}"
        self.url = self.console_base() + "/console/"

    def console_base(self):
        return f"http://127.0.0.1:{self.metrics_port}"

    def sqs(self, tenant=None):
        akid, secret = (tenant[0], tenant[1]) if tenant else ("AKIDANY", "any-secret")
        return boto3.client(
            "sqs", endpoint_url=self.endpoint, region_name=REGION,
            aws_access_key_id=akid, aws_secret_access_key=secret,
            config=Config(retries={"max_attempts": 1}, read_timeout=40),
        )

    def request(self, path, method="GET", body=None, headers=None):
        """A raw request to the console's listener: (status, headers, parsed JSON or text)."""
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.console_base() + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, hdrs, raw = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, raw = e.code, e.headers, e.read()
        try:
            return status, hdrs, json.loads(raw)
        except ValueError:
            return status, hdrs, raw.decode(errors="replace")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def open_broker():
    b = Broker(auth=False)
    yield b
    b.stop()


@pytest.fixture(scope="session")
def auth_broker():
    b = Broker(auth=True)
    yield b
    b.stop()


@pytest.fixture(scope="session")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    service = Service(executable_path=os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(service=service, options=opts)
    d.set_page_load_timeout(WAIT_S)
    yield d
    d.quit()


@pytest.fixture
def name():
    return "c-" + uuid.uuid4().hex[:16]


def shot(driver, page):
    os.makedirs(SHOTS, exist_ok=True)
    path = os.path.join(SHOTS, page + ".png")
    driver.save_screenshot(path)
    return path
