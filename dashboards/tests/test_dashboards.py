"""The Grafana dashboard and the Prometheus alert rules of dashboards/, against the real thing.

- `promtool check rules` and `promtool test rules` (dashboards/alerts_test.yml: each alert fires
  when its condition holds and not otherwise) pass; every alert has a one-line runbook and a
  firing case in the unit tests.
- A real Prometheus (Debian's package), started here on a free loopback port with its data in a
  temporary directory, scrapes a real sluiced (SLUICE_BIN) every second under a small bounded
  load: SQS sends, receives and deletes, messages dead-lettered by maxReceiveCount and redriven,
  a Kafka produce and a consumer group that commits and then lags, a burst over a per-account
  request quota. Every dashboard query and every series an alert reads returns data; the
  dead-letter alert fires for the queue whose messages went to its DLQ and for no other.
- The disk alerts fire on the live broker: its data dir is on a small ext4 file system mounted
  here (a loop device: needs root; without it that test is skipped and says so), which a filler
  file brings under twice the reserve (SluiceDiskNearlyFull) and then under it (SluiceDiskFull,
  sends refused); removing the file clears them.

Rules are evaluated every second from a copy of alerts.yml whose `for:` durations are 0s (the
only change), so that alerts fire within seconds.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import boto3
import pytest
import requests
import yaml
from botocore.config import Config

HERE = os.path.dirname(os.path.abspath(__file__))
DASHBOARDS = os.path.dirname(HERE)
RULES = os.path.join(DASHBOARDS, "alerts.yml")
RULES_TESTS = os.path.join(DASHBOARDS, "alerts_test.yml")
DASHBOARD = os.path.join(DASHBOARDS, "sluice-broker.json")

MIB = 1024 * 1024
# The data disk of the live broker (with root): small, so that a filler file fills it at once.
FS_BYTES = 256 * MIB
# Free bytes under which the broker refuses sends (--disk-free-bytes-min).
RESERVE_BYTES = 32 * MIB
# Requests per second per account (2 shards: half of it each); the burst goes well past it.
QUOTA_REQUESTS_PER_S = 50
# The burst goes on until this many requests were refused (or QUOTA_BURST_S passed: a machine
# too slow to exceed the quota fails the test, saying so).
QUOTA_REFUSALS_MIN = 5
QUOTA_BURST_S = 30
QUOTA_BURST_THREADS = 8
# How long a check waits for Prometheus to scrape and evaluate (1 s intervals).
SETTLE_S = 60
ACCOUNT = "000000000000"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, timeout_s=SETTLE_S, interval_s=0.5):
    """Polls `check` until it returns something truthy; fails naming `what` (and the last
    value) after `timeout_s`."""
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def run(*cmd, timeout=120):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def tool(name):
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found: ci/install-deps.sh installs Debian's prometheus package")
    return path


class LoopFs:
    """A small ext4 file system on a loop device (root only), unmounted by `close`."""

    def __init__(self, dir):
        self.image = os.path.join(dir, "disk.img")
        self.mount = os.path.join(dir, "mnt")
        os.makedirs(self.mount)
        with open(self.image, "wb") as f:
            f.truncate(FS_BYTES)
        for cmd in (["mkfs.ext4", "-q", "-F", self.image], ["mount", "-o", "loop", self.image, self.mount]):
            r = run(*cmd)
            if r.returncode != 0:
                raise OSError(f"{cmd}: {r.stderr.strip()}")

    def close(self):
        run("umount", self.mount)


class Stack:
    """sluiced and a Prometheus scraping it, each on free loopback ports, in a temp dir."""

    def __init__(self):
        binary = os.environ.get("SLUICE_BIN")
        if not binary or not os.path.exists(binary):
            pytest.fail("SLUICE_BIN must name a built sluiced binary (ci/test.sh sets it)")
        self.dir = tempfile.mkdtemp(prefix="sluice-dash-")
        self.procs = []
        self.fs = None
        self.broker_log = os.path.join(self.dir, "sluiced.log")
        self.prom_log = os.path.join(self.dir, "prometheus.log")
        try:
            self.start(binary)
        except BaseException:
            # Nothing left running or mounted when the start fails; its logs say why.
            sys.__stderr__.write(self.logs() + "\n")
            self.close()
            raise

    def start(self, binary):
        self.fs_error = "not root: a loop file system needs root"
        if os.geteuid() == 0:
            try:
                self.fs = LoopFs(self.dir)
            except OSError as e:
                self.fs_error = str(e)
        data = os.path.join(self.fs.mount if self.fs else self.dir, "data")
        self.http, self.metrics, self.kafka = free_port(), free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.http}"
        self.bootstrap = f"127.0.0.1:{self.kafka}"
        self.broker = self.spawn(
            [
                binary,
                "--data-dir", data,
                "--shards", "2",
                "--partitions", "1",
                "--http-addr", f"127.0.0.1:{self.http}",
                "--quic-addr", f"127.0.0.1:{free_port()}",
                "--metrics-addr", f"127.0.0.1:{self.metrics}",
                "--kafka-addr", self.bootstrap,
                "--disk-free-bytes-min", str(RESERVE_BYTES),
                "--quota-requests-per-s", str(QUOTA_REQUESTS_PER_S),
            ],
            self.broker_log,
            dict(os.environ, SLUICE_AUTH="none", RUST_LOG="warn"),
        )
        def broker_ready():
            if self.broker.poll() is not None:
                pytest.fail(f"sluiced exited ({self.broker.returncode})")
            return self.get(f"http://127.0.0.1:{self.metrics}/ready", 200)

        wait_for("sluiced /ready", broker_ready, 30)

        # The rules as shipped, but every `for:` 0s: the live checks need not wait minutes.
        text = open(RULES).read()
        fast, n = re.subn(r"(?m)^(\s+for:\s*)\S+\s*$", r"\g<1>0s", text)
        assert n == len(alert_rules()), "each alert has one `for:` line"
        self.rules = os.path.join(self.dir, "alerts.yml")
        with open(self.rules, "w") as f:
            f.write(fast)
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [self.rules],
                    "scrape_configs": [
                        {
                            "job_name": "sluice",
                            "static_configs": [{"targets": [f"127.0.0.1:{self.metrics}"]}],
                        }
                    ],
                },
                f,
            )
        self.prom = f"http://127.0.0.1:{free_port()}"
        self.spawn(
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={os.path.join(self.dir, 'tsdb')}",
                f"--web.listen-address={self.prom[len('http://'):]}",
                "--log.level=warn",
            ],
            self.prom_log,
            dict(os.environ),
        )
        wait_for("Prometheus /-/ready", lambda: self.get(self.prom + "/-/ready", 200), 30)

    def spawn(self, cmd, log_path, env):
        log = open(log_path, "wb")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((proc, log))
        return proc

    @staticmethod
    def get(url, status):
        try:
            return requests.get(url, timeout=5).status_code == status
        except requests.RequestException:
            return False

    def logs(self):
        out = []
        for path in (self.broker_log, self.prom_log):
            if not os.path.exists(path):
                continue
            with open(path, "rb") as f:
                out.append(f"--- {os.path.basename(path)}\n" + f.read()[-4000:].decode(errors="replace"))
        return "\n".join(out)

    def query(self, expr):
        """An instant query: the result vector; fails on an error answer."""
        r = requests.get(self.prom + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def alerts(self, name):
        """The alerts named `name` as Prometheus holds them now: [(state, labels)]."""
        body = requests.get(self.prom + "/api/v1/alerts", timeout=10).json()
        return [
            (a["state"], a["labels"])
            for a in body["data"]["alerts"]
            if a["labels"]["alertname"] == name
        ]

    def firing(self, name):
        return [labels for state, labels in self.alerts(name) if state == "firing"]

    def sqs(self, retries=10):
        return boto3.client(
            "sqs",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="AKIDDASHBOARDS",
            aws_secret_access_key="unused-auth-is-off",
            # Retries with back-off: the quota burst may throttle the load's own requests.
            config=Config(retries={"max_attempts": retries, "mode": "standard"}, read_timeout=30),
        )

    def close(self):
        for proc, log in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        if self.fs:
            self.fs.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def alert_rules():
    doc = yaml.safe_load(open(RULES))
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def dashboard_queries():
    """(panel title, expr) of every target, with the dashboard's variables filled in as Grafana
    would for "all brokers" (and a rate window that spans the test's scrapes)."""
    dash = json.load(open(DASHBOARD))
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            expr = (
                t["expr"]
                .replace("$__rate_interval", "5m")
                .replace('"$instance"', '".*"')
                .replace('"$job"', '"sluice"')
            )
            assert "$" not in expr, f"unknown variable in {p['title']}: {expr}"
            out.append((p["title"], expr))
    return out


@pytest.fixture(scope="module")
def stack(request):
    s = Stack()
    try:
        yield s
    finally:
        if request.session.testsfailed:
            # Past pytest's capture: the broker's and Prometheus's last words explain a failure.
            sys.__stderr__.write(s.logs() + "\n")
        s.close()


@pytest.fixture(scope="module")
def loaded(stack):
    """Runs the bounded load once; returns what it did."""
    return load(stack)


# ---------------------------------------------------------------------- static checks


def test_promtool_check_rules_passes():
    r = run(tool("promtool"), "check", "rules", RULES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in r.stdout, r.stdout


def test_promtool_unit_tests_pass_and_cover_every_alert():
    r = run(tool("promtool"), "test", "rules", RULES_TESTS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout, r.stdout
    tests = yaml.safe_load(open(RULES_TESTS))
    fires, quiet = set(), set()
    for t in tests["tests"]:
        for a in t.get("alert_rule_test", []):
            (fires if a.get("exp_alerts") else quiet).add(a["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - fires == set(), "alerts without a test where they fire"
    assert names - quiet == set(), "alerts without a test where they stay quiet"


def test_every_alert_has_a_one_line_runbook_and_a_severity():
    for r in alert_rules():
        runbook = r.get("annotations", {}).get("runbook", "")
        assert runbook and "\n" not in runbook.strip(), r["alert"]
        assert r.get("labels", {}).get("severity") in ("page", "warning"), r["alert"]


def test_dashboard_is_well_formed():
    dash = json.load(open(DASHBOARD))
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance"} <= names
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
    # What the issue asks the dashboard to show, by the series it reads.
    exprs = " ".join(e for _, e in dashboard_queries())
    for series in [
        "sluice_messages_sent_total", "sluice_messages_received_total", "sluice_messages_deleted_total",
        'action=~"Produce|Fetch"', "sluice_message_send_to_receive_seconds_bucket",
        "sluice_oldest_message_age_seconds", "sluice_messages_dead_lettered_total",
        "sluice_log_fsync_duration_seconds_bucket", "sluice_disk_free_bytes", "sluice_disk_full",
        "sluice_account_quota_throttled_total", "sluice_group_lag",
    ]:
        assert series in exprs, series


# ---------------------------------------------------------------------- the live broker


def load(stack):
    """A small bounded load: about 15 s. SQS sends, receives and deletes; a queue whose
    messages reach maxReceiveCount and go to its DLQ, then are redriven; a Kafka topic, a
    consumer group that commits and then falls behind; a burst over the request quota."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    sqs = stack.sqs()
    events = sqs.create_queue(QueueName="events")["QueueUrl"]
    dlq = sqs.create_queue(QueueName="orders-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    orders = sqs.create_queue(
        QueueName="orders",
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})},
    )["QueueUrl"]

    # Prometheus must see the counters at 0 before they move: increase() does not count a
    # series that first appears already at its final value.
    wait_for(
        "Prometheus to scrape the new queues",
        lambda: len(stack.query('sluice_queue_messages_dead_lettered_total{job="sluice"}')) == 3,
    )
    for i in range(3):
        sqs.send_message_batch(
            QueueUrl=events,
            Entries=[{"Id": str(j), "MessageBody": f"event {i}-{j}"} for j in range(10)],
        )
    deleted = 0
    while deleted < 20:
        got = sqs.receive_message(QueueUrl=events, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for m in got.get("Messages", []):
            sqs.delete_message(QueueUrl=events, ReceiptHandle=m["ReceiptHandle"])
            deleted += 1
    # The rest (10) stay in the queue: a backlog with an age.

    # Poison messages: received and never deleted; with maxReceiveCount 1 the next receive
    # moves each to the DLQ.
    sqs.send_message_batch(
        QueueUrl=orders, Entries=[{"Id": str(j), "MessageBody": f"poison {j}"} for j in range(5)]
    )

    def dlq_depth():
        a = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
        return int(a["Attributes"]["ApproximateNumberOfMessages"])

    def receive_orders():
        sqs.receive_message(QueueUrl=orders, MaxNumberOfMessages=10, VisibilityTimeout=0)
        return dlq_depth() >= 5

    wait_for("5 messages in orders-dlq", receive_orders, 30, 0.2)
    # Redrive the DLQ back to its source queue, and wait for the task to finish.
    sqs.start_message_move_task(SourceArn=dlq_arn)
    wait_for(
        "the redrive task to complete",
        lambda: any(
            t["Status"] == "COMPLETED"
            for t in sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        ),
        30,
    )

    # Kafka: a topic, 40 records, a group that consumes and commits 40, then 20 more records.
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    for _, f in admin.create_topics([NewTopic("clicks", num_partitions=2, replication_factor=1)]).items():
        f.result(timeout=20)
    producer = Producer({"bootstrap.servers": stack.bootstrap, "acks": "all"})

    def produce(n, start):
        for i in range(start, start + n):
            producer.produce("clicks", key=f"k{i % 4}", value=f"click {i}")
        assert producer.flush(20) == 0

    produce(40, 0)
    consumer = Consumer(
        {
            "bootstrap.servers": stack.bootstrap,
            "group.id": "billing",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe(["clicks"])
    seen = 0
    deadline = time.time() + 45
    while seen < 40 and time.time() < deadline:
        m = consumer.poll(0.2)
        if m is not None and m.error() is None:
            seen += 1
    assert seen == 40, f"consumed {seen} of 40"
    consumer.commit(asynchronous=False)
    consumer.close()
    produce(20, 40)

    # A burst past the account's request quota (no retries: throttled answers are the point).
    burst = stack.sqs(retries=1)
    throttled = [0]
    lock = threading.Lock()
    deadline = time.time() + QUOTA_BURST_S

    def hammer():
        while time.time() < deadline:
            with lock:
                if throttled[0] >= QUOTA_REFUSALS_MIN:
                    return
            try:
                burst.list_queues()
            except burst.exceptions.ClientError as e:
                if e.response["Error"]["Code"] != "RequestThrottled":
                    raise
                with lock:
                    throttled[0] += 1

    threads = [threading.Thread(target=hammer) for _ in range(QUOTA_BURST_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert throttled[0] >= QUOTA_REFUSALS_MIN, f"the burst was throttled {throttled[0]} times in {QUOTA_BURST_S}s"
    return {"dlq_arn": dlq_arn, "throttled": throttled[0]}


def test_every_dashboard_query_returns_series(stack, loaded):
    queries = dashboard_queries()

    def empty():
        return [(title, expr) for title, expr in queries if not stack.query(expr)]

    missing = empty()
    deadline = time.time() + SETTLE_S
    while missing and time.time() < deadline:
        time.sleep(1)
        missing = empty()
    assert not missing, "dashboard queries without series:\n" + "\n".join(f"{t}: {e}" for t, e in missing)


def test_every_alert_expression_reads_live_series(stack, loaded):
    """Each alert's expression evaluates, and every series it reads exists on the live broker
    (the conditions themselves do not hold on a healthy broker, so the alerts' results are
    empty: the next tests make two of them happen)."""
    for r in alert_rules():
        stack.query(r["expr"])
        names = set(re.findall(r"\b(sluice_[a-z0-9_]+|up)\s*[{\[)]", r["expr"]))
        names |= set(re.findall(r"\b(sluice_[a-z0-9_]+)\b", r["expr"]))
        assert names, r["alert"]
        for name in sorted(names):
            selector = 'up{job="sluice"}' if name == "up" else name
            wait_for(f"series {selector} of {r['alert']}", lambda: stack.query(f"count({selector})"), SETTLE_S)


def test_healthy_broker_fires_nothing_but_the_dead_letter_alert(stack, loaded):
    def dead_lettering():
        return stack.firing("SluiceDeadLettering")

    counters = stack.query('sluice_queue_messages_dead_lettered_total{job="sluice"}')
    firing = wait_for(f"SluiceDeadLettering to fire ({counters})", dead_lettering)
    assert [(a["tenant"], a["queue"]) for a in firing] == [(ACCOUNT, "orders")], firing
    # Its broker-wide twin stays quiet while per-queue series exist; so does every other alert
    # but the fsync one, which depends on this host's disk (shared, loaded CI machines).
    quiet = {r["alert"] for r in alert_rules()} - {"SluiceDeadLettering", "SluiceFsyncSlow"}
    for name in sorted(quiet):
        assert stack.alerts(name) == [], name
    # The redrive moved them back; the quota burst was counted for this account.
    redriven = stack.query('sluice_messages_redriven_total{job="sluice"}')
    assert float(redriven[0]["value"][1]) >= 5, redriven
    hits = wait_for(
        "the quota refusals in Prometheus",
        lambda: [
            s for s in stack.query(
                f'sluice_account_quota_throttled_total{{tenant="{ACCOUNT}",quota="requests_per_s"}}'
            )
            if float(s["value"][1]) >= loaded["throttled"]
        ],
    )
    assert hits


def test_disk_alerts_fire_when_the_disk_fills_and_clear_when_it_is_freed(stack, loaded):
    if stack.fs is None:
        pytest.skip(f"no small file system to fill ({stack.fs_error})")
    filler = os.path.join(stack.fs.mount, "filler")

    def free_bytes():
        st = os.statvfs(stack.fs.mount)
        return st.f_bavail * st.f_frsize

    def fill_to(target_free):
        """Grows the filler file until the file system has about `target_free` bytes free."""
        need = free_bytes() - target_free
        assert need > 0, (free_bytes(), target_free)
        size = os.path.getsize(filler) if os.path.exists(filler) else 0
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, size, need)
        finally:
            os.close(fd)

    assert stack.query('sluice_disk_full{job="sluice"} == 0'), "not full before"
    assert stack.firing("SluiceDiskNearlyFull") == [] and stack.firing("SluiceDiskFull") == []
    try:
        # Under twice the reserve, over the reserve: nearly full, sends still accepted.
        fill_to(RESERVE_BYTES * 3 // 2)
        wait_for("SluiceDiskNearlyFull to fire", lambda: stack.firing("SluiceDiskNearlyFull"))
        assert stack.firing("SluiceDiskFull") == []
        sqs = stack.sqs(retries=1)
        events = sqs.get_queue_url(QueueName="events")["QueueUrl"]
        sqs.send_message(QueueUrl=events, MessageBody="still room")

        # Under the reserve: full; sends refused (retryable), the alert pages.
        fill_to(RESERVE_BYTES // 2)
        wait_for("SluiceDiskFull to fire", lambda: stack.firing("SluiceDiskFull"))
        with pytest.raises(sqs.exceptions.ClientError) as refused:
            sqs.send_message(QueueUrl=events, MessageBody="no room")
        assert refused.value.response["Error"]["Code"] == "ServiceUnavailable"
        assert stack.firing("SluiceDiskNearlyFull") == [], "the full alert takes over"
    finally:
        if os.path.exists(filler):
            os.remove(filler)
    # Freed: both clear (and sends resume by themselves).
    wait_for(
        "the disk alerts to clear",
        lambda: not stack.alerts("SluiceDiskFull") and not stack.alerts("SluiceDiskNearlyFull"),
    )
    stack.sqs().send_message(QueueUrl=stack.sqs().get_queue_url(QueueName="events")["QueueUrl"], MessageBody="again")
