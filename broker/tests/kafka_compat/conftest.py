"""Fixtures of the Kafka compatibility suite: a real `sluiced` (built by cargo, path in
SLUICE_BIN) with its Kafka listener on a free port, authentication on (SASL/PLAIN with Sluice
access keys), a temporary data dir; fresh topic and group names per test. `Broker.restart()`
stops it (SIGTERM) and starts it again on the same data dir and ports."""

import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid

import pytest

ACCESS_KEY = "AKIDKAFKACOMPAT"
SECRET_KEY = "kafka-compat-secret"
ACCOUNT = "000000000000"
# A second tenant: its topics are invisible to the first.
TENANT_B = ("AKIDKAFKAB", "kafka-b-secret", "222222222222")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self):
        binary = os.environ.get("SLUICE_BIN")
        if not binary or not os.path.exists(binary):
            pytest.fail("SLUICE_BIN must name a built sluiced binary (ci/test.sh sets it)")
        self.binary = binary
        self.dir = tempfile.mkdtemp(prefix="sluice-kafka-")
        self.port = free_port()
        self.ports = [free_port(), free_port(), free_port()]
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc = None
        self.log = None
        self.start()

    def start(self):
        env = dict(
            os.environ,
            SLUICE_AUTH="sigv4",
            SLUICE_ACCESS_KEYS=",".join(
                ":".join(k) for k in [(ACCESS_KEY, SECRET_KEY, ACCOUNT), TENANT_B]
            ),
            RUST_LOG="info",
        )
        self.log = open(os.path.join(self.dir, "sluiced.log"), "ab")
        http, quic, metrics = self.ports
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--data-dir", os.path.join(self.dir, "d"),
                "--shards", "2",
                "--http-addr", f"127.0.0.1:{http}",
                "--quic-addr", f"127.0.0.1:{quic}",
                "--metrics-addr", f"127.0.0.1:{metrics}",
                "--kafka-addr", self.bootstrap,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.proc.kill()
                    pytest.fail("sluiced did not start: " + self.log_text())
                time.sleep(0.05)

    def log_text(self):
        return open(os.path.join(self.dir, "sluiced.log"), "rb").read().decode(errors="replace")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def remove(self):
        """Stops the broker and deletes its data dir (the suite leaves nothing in /tmp)."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self):
        self.stop()
        self.start()

    def alive(self):
        return self.proc.poll() is None

    def confluent(self, **extra):
        """librdkafka settings: SASL/PLAIN with the suite's access key."""
        c = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": ACCESS_KEY,
            "sasl.password": SECRET_KEY,
        }
        c.update(extra)
        return c

    def kafka_python(self, **extra):
        c = dict(
            bootstrap_servers=self.bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username=ACCESS_KEY,
            sasl_plain_password=SECRET_KEY,
        )
        c.update(extra)
        return c

    def kcat(self, *args, input=None, timeout=30):
        cmd = [
            "kcat", "-b", self.bootstrap,
            "-X", "security.protocol=SASL_PLAINTEXT",
            "-X", "sasl.mechanisms=PLAIN",
            "-X", f"sasl.username={ACCESS_KEY}",
            "-X", f"sasl.password={SECRET_KEY}",
            *args,
        ]
        return subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)


@pytest.fixture(scope="session")
def broker():
    b = Broker()
    yield b
    b.remove()


@pytest.fixture
def topic():
    return "t-" + uuid.uuid4().hex[:16]


@pytest.fixture
def group():
    return "g-" + uuid.uuid4().hex[:16]


def create_topic(broker, name, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(broker.confluent())
    for _, f in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).items():
        f.result(timeout=20)


# ------------------------------------------------------------------------ raw protocol


class Raw:
    """A bare TCP connection speaking Kafka frames by hand, for bad input and exact checks."""

    def __init__(self, broker, authenticate=True):
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        self.corr = 0
        if authenticate:
            self.sasl_plain(ACCESS_KEY, SECRET_KEY)

    def close(self):
        self.sock.close()

    def send_frame(self, payload):
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def recv_frame(self):
        head = self._recv_exact(4)
        if head is None:
            return None
        (n,) = struct.unpack(">i", head)
        return self._recv_exact(n)

    def _recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def request(self, api_key, version, body, header_v2=False):
        """Sends a request with a v1 header (v2: plus an empty tagged-field section); returns
        (correlation id, response body after the correlation id)."""
        self.corr += 1
        header = struct.pack(">hhi", api_key, version, self.corr) + string(b"raw-test")
        if header_v2:
            header += b"\x00"
        self.send_frame(header + body)
        resp = self.recv_frame()
        assert resp is not None, "connection closed instead of an answer"
        (corr,) = struct.unpack(">i", resp[:4])
        return corr, resp[4:]

    def sasl_plain(self, user, password):
        _, body = self.request(17, 1, string(b"PLAIN"))
        assert struct.unpack(">h", body[:2])[0] == 0
        token = b"\x00" + user.encode() + b"\x00" + password.encode()
        _, body = self.request(36, 0, struct.pack(">i", len(token)) + token)
        return struct.unpack(">h", body[:2])[0]


def string(b):
    return struct.pack(">h", len(b)) + b


def produce_v3(topic, partition, batch, acks=-1):
    """A Produce v3 body: one topic, one partition."""
    return (
        struct.pack(">h", -1)  # transactional id: null
        + struct.pack(">hi", acks, 10_000)
        + struct.pack(">i", 1) + string(topic.encode())
        + struct.pack(">i", 1) + struct.pack(">i", partition)
        + struct.pack(">i", len(batch)) + bytes(batch)
    )


def parse_produce_v3(body):
    """[(partition, error code, base offset)] of a one-topic Produce v3 response."""
    (n,) = struct.unpack(">i", body[:4])
    assert n == 1
    (ln,) = struct.unpack(">h", body[4:6])
    at = 6 + ln
    (parts,) = struct.unpack(">i", body[at:at + 4])
    at += 4
    out = []
    for _ in range(parts):
        p, code, base, _ = struct.unpack(">ihqq", body[at:at + 22])
        out.append((p, code, base))
        at += 22
    return out


def record_batch(values, producer_id=-1, epoch=-1, base_sequence=-1, timestamp_ms=None):
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False,
        producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
    for i, v in enumerate(values):
        b.append(i, timestamp=ts, key=None, value=v, headers=[])
    return b.build()
