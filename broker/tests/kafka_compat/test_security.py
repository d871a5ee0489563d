"""Security on the Kafka port: TLS (the broker's self-signed certificate, client certificates
mapped to accounts), SASL/SCRAM-SHA-256 and -512 from librdkafka (confluent-kafka), kafkajs and
raw frames, TLS and SCRAM together, a wrong password refused, and per-account byte quotas.

The SCRAM credentials are computed here with Python's hashlib (RFC 5802), independently of the
broker's code, and written into its config file as `sluice scram-credential` prints them."""

import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import time
import uuid

import pytest

from conftest import Broker, string

SCRAM_USERS = {
    # user: (password, account)
    "alice": ("alice-pw-\u00e9", "000000000000"),
    "carol": ("carol-pw", "333333333333"),
}
CERT_NAME = "svc-client"
CERT_ACCOUNT = "333333333333"
ITERATIONS = 4096


def scram_entry(user, password, account, mechanism):
    h = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac(h, password.encode(), salt, ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", h).digest()
    stored_key = hashlib.new(h, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", h).digest()
    b64 = lambda b: base64.b64encode(b).decode()
    return (
        "[[auth.scram_credentials]]\n"
        f"user = {json.dumps(user)}\nmechanism = \"{mechanism}\"\naccount = \"{account}\"\n"
        f"iterations = {ITERATIONS}\nsalt = \"{b64(salt)}\"\n"
        f"stored_key = \"{b64(stored_key)}\"\nserver_key = \"{b64(server_key)}\"\n"
    )


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_client_pki(d):
    """A CA, and a client certificate named CERT_NAME signed by it (clientAuth usage)."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=sluice-test-ca", cwd=d)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "client.key", "-out", "client.csr", "-subj", f"/CN={CERT_NAME}", cwd=d)
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "client.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return {k: os.path.join(d, f) for k, f in
            [("ca", "ca.pem"), ("cert", "client.pem"), ("key", "client.key")]}


class ConfiguredBroker(Broker):
    """The suite's broker with a config file (`--config`) besides its flags."""

    def __init__(self, config_text):
        self.config_text = config_text
        super().__init__()

    def start(self):
        path = os.path.join(self.dir, "sluice.toml")
        with open(path, "w") as f:
            f.write(self.config_text)
        os.environ["SLUICE_CONFIG"] = path
        try:
            super().start()
        finally:
            del os.environ["SLUICE_CONFIG"]

    def cert_path(self):
        """The broker's self-signed certificate (QUIC's, served on the Kafka port too)."""
        return os.path.join(self.dir, "d", "quic-selfsigned-cert.pem")


def security_config(pki):
    text = (
        "[kafka]\ntls = true\n"
        f"client_ca = \"{pki['ca']}\"\nclient_auth = \"requested\"\n"
        f"client_cert_accounts = {{ \"{CERT_NAME}\" = \"{CERT_ACCOUNT}\" }}\n\n"
    )
    for user, (pw, account) in SCRAM_USERS.items():
        for m in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            text += scram_entry(user, pw, account, m) + "\n"
    return text


@pytest.fixture(scope="module")
def pki():
    d = tempfile.mkdtemp(prefix="sluice-pki-")
    yield make_client_pki(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_broker(pki):
    b = ConfiguredBroker(security_config(pki))
    yield b
    b.remove()


def scram_conf(b, user, mechanism, password=None, **extra):
    c = {
        "bootstrap.servers": b.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": b.cert_path(),
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password if password is not None else SCRAM_USERS[user][0],
    }
    c.update(extra)
    return c


def produce_and_read_back(conf, topic, values):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(conf)
    for _, f in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).items():
        f.result(timeout=20)
    p = Producer(dict(conf))
    errors = []
    for v in values:
        p.produce(topic, v, on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(20) == 0
    assert not errors, errors
    c = Consumer(dict(conf, **{"group.id": "g-" + uuid.uuid4().hex[:8],
                                "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got = []
    deadline = time.time() + 30
    while len(got) < len(values) and time.time() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == values


def topics_seen(conf):
    from confluent_kafka.admin import AdminClient

    return set(AdminClient(conf).list_topics(timeout=20).topics)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_librdkafka_scram_over_tls(tls_broker, topic, mechanism):
    values = [f"{mechanism}-{i}".encode() for i in range(5)]
    produce_and_read_back(scram_conf(tls_broker, "alice", mechanism), topic, values)


def test_librdkafka_wrong_scram_password_is_refused(tls_broker):
    from confluent_kafka import KafkaError, Producer

    errors = []
    # A slow reconnect: each failed login counts against this address's bound (see sasl.rs).
    conf = scram_conf(tls_broker, "alice", "SCRAM-SHA-256", password="not-the-password",
                      error_cb=errors.append, **{"reconnect.backoff.ms": 3000,
                                                 "reconnect.backoff.max.ms": 10000})
    p = Producer(conf)
    deadline = time.time() + 20
    while not errors and time.time() < deadline:
        p.poll(0.2)
    assert errors, "no error reported"
    e = errors[0]
    assert e.code() == KafkaError._AUTHENTICATION, e
    assert "Authentication failed" in e.str() and "SCRAM-SHA-256" in e.str(), e.str()


def test_client_certificate_maps_to_its_account(tls_broker, pki, topic):
    """A verified certificate named in client_cert_accounts acts in that account, no SASL."""
    cert_conf = {
        "bootstrap.servers": tls_broker.bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": tls_broker.cert_path(),
        "ssl.certificate.location": pki["cert"],
        "ssl.key.location": pki["key"],
    }
    produce_and_read_back(cert_conf, topic, [b"from-a-certificate"])
    # carol logs in with SCRAM to the certificate's account: she sees the topic; alice, in
    # another account, does not.
    assert topic in topics_seen(scram_conf(tls_broker, "carol", "SCRAM-SHA-512"))
    assert topic not in topics_seen(scram_conf(tls_broker, "alice", "SCRAM-SHA-256"))


def test_tls_without_credentials_is_refused(tls_broker):
    """Authentication is on: TLS alone, without a mapped certificate, gets no access."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    conf = {
        "bootstrap.servers": tls_broker.bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": tls_broker.cert_path(),
    }
    try:
        md = AdminClient(conf).list_topics(timeout=5)
    except KafkaException:
        return
    assert not md.topics, "an unauthenticated client saw topics"


def test_plaintext_client_gets_nothing_from_a_tls_listener(tls_broker):
    with socket.create_connection(("127.0.0.1", tls_broker.port), timeout=5) as s:
        # ApiVersions v0 in the clear: a TLS server reads it as a bad handshake and closes.
        s.sendall(struct.pack(">ihhi", 10, 18, 0, 1) + string(b"x"))
        data = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        assert struct.pack(">i", 1) not in data[:8], "no Kafka answer in the clear"


# ------------------------------------------------------------------ raw SCRAM over TLS


class TlsRaw:
    def __init__(self, broker, cert=None):
        ctx = ssl.create_default_context(cafile=broker.cert_path())
        if cert:
            ctx.load_cert_chain(cert["cert"], cert["key"])
        raw = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self.corr = 0

    def request(self, api_key, version, body):
        self.corr += 1
        header = struct.pack(">hhi", api_key, version, self.corr) + string(b"raw-tls")
        payload = header + body
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        head = self._recv(4)
        if head is None:
            return None
        (n,) = struct.unpack(">i", head)
        resp = self._recv(n)
        return resp[4:]

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except (ConnectionResetError, ssl.SSLError):
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    def handshake(self, mechanism):
        body = self.request(17, 1, string(mechanism.encode()))
        assert struct.unpack(">h", body[:2])[0] == 0

    def authenticate(self, token):
        """SaslAuthenticate v1: (error code, message, auth bytes), or None if closed."""
        body = self.request(36, 1, struct.pack(">i", len(token)) + token)
        if body is None:
            return None
        (code, mlen) = struct.unpack(">hh", body[:4])
        at = 4
        msg = None
        if mlen >= 0:
            msg = body[at:at + mlen].decode()
            at += mlen
        (alen,) = struct.unpack(">i", body[at:at + 4])
        return code, msg, body[at + 4:at + 4 + alen]

    def closed(self):
        self.sock.settimeout(5)
        return self._recv(1) is None


class ScramClient:
    """RFC 5802's client side, for exact checks of the server's answers."""

    def __init__(self, mechanism, user, password):
        self.h = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.user, self.password = user, password
        self.nonce = base64.b64encode(os.urandom(18)).decode()
        self.bare = f"n={user},r={self.nonce}"

    def first(self):
        return ("n,," + self.bare).encode()

    def final(self, server_first):
        fields = dict(f.split("=", 1) for f in server_first.decode().split(","))
        assert fields["r"].startswith(self.nonce)
        salted = hashlib.pbkdf2_hmac(self.h, self.password.encode(),
                                     base64.b64decode(fields["s"]), int(fields["i"]))
        client_key = hmac.new(salted, b"Client Key", self.h).digest()
        stored = hashlib.new(self.h, client_key).digest()
        without_proof = f"c=biws,r={fields['r']}"
        auth = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        sig = hmac.new(stored, auth, self.h).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, sig))
        server_key = hmac.new(salted, b"Server Key", self.h).digest()
        self.expected_server_final = b"v=" + base64.b64encode(hmac.new(server_key, auth, self.h).digest())
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_raw_scram_exchange_proves_the_server_and_refuses_a_replay(tls_broker):
    user = "alice"
    pw = SCRAM_USERS[user][0]
    c = TlsRaw(tls_broker)
    c.handshake("SCRAM-SHA-256")
    client = ScramClient("SCRAM-SHA-256", user, pw)
    code, _, server_first = c.authenticate(client.first())
    assert code == 0
    final = client.final(server_first)
    code, _, server_final = c.authenticate(final)
    assert code == 0
    assert server_final == client.expected_server_final, "the server knew the stored keys"
    # The recorded client-final replayed in a new exchange: the server's nonce differs.
    c2 = TlsRaw(tls_broker)
    c2.handshake("SCRAM-SHA-256")
    code, _, _ = c2.authenticate(client.first())
    assert code == 0
    answer = c2.authenticate(final)
    assert answer is not None and answer[0] == 58, answer  # SASL_AUTHENTICATION_FAILED
    assert c2.closed(), "a failed login closes the connection, as Kafka does"


def test_raw_scram_wrong_proof_gets_58_and_a_close(tls_broker):
    c = TlsRaw(tls_broker)
    c.handshake("SCRAM-SHA-512")
    client = ScramClient("SCRAM-SHA-512", "carol", "wrong-password")
    code, _, server_first = c.authenticate(client.first())
    assert code == 0
    code, msg, _ = c.authenticate(client.final(server_first))
    assert code == 58 and "Authentication failed" in msg, (code, msg)
    assert c.closed()


# --------------------------------------------------------------------------- kafkajs


def kafkajs_dir():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    d = os.environ.get("SLUICE_KAFKAJS_DIR", os.path.join(root, "target", "kafkajs"))
    if not os.path.isdir(os.path.join(d, "node_modules", "kafkajs")):
        pytest.fail(f"kafkajs is not installed in {d} (ci/install-deps.sh installs it)")
    return d


KAFKAJS_SCRIPT = r"""
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');
const cfg = JSON.parse(process.argv[1]);
const ssl = { ca: [fs.readFileSync(cfg.ca)] };
if (cfg.cert) { ssl.cert = fs.readFileSync(cfg.cert); ssl.key = fs.readFileSync(cfg.key); }
const kafka = new Kafka({
  clientId: 'kafkajs-security', brokers: [cfg.bootstrap], ssl,
  sasl: cfg.mechanism ? { mechanism: cfg.mechanism, username: cfg.user, password: cfg.password } : undefined,
  logLevel: logLevel.NOTHING, retry: { retries: 1 }, connectionTimeout: 5000,
});
(async () => {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic: cfg.topic, numPartitions: 1 }] });
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({ topic: cfg.topic, messages: cfg.values.map(v => ({ value: v })) });
  await producer.disconnect();
  const offsets = await admin.fetchTopicOffsets(cfg.topic);
  await admin.disconnect();
  console.log(JSON.stringify({ ok: true, high: offsets[0].high }));
})().catch(e => { console.log(JSON.stringify({ ok: false, name: e.name, message: e.message })); });
"""


def run_kafkajs(cfg):
    d = kafkajs_dir()
    env = dict(os.environ, NODE_PATH=os.path.join(d, "node_modules"))
    out = subprocess.run(["node", "-e", KAFKAJS_SCRIPT, json.dumps(cfg)], env=env,
                         capture_output=True, timeout=60, text=True)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    assert lines, out.stdout + out.stderr
    return json.loads(lines[-1])


@pytest.mark.parametrize("mechanism", ["scram-sha-256", "scram-sha-512"])
def test_kafkajs_scram_over_tls(tls_broker, topic, mechanism):
    values = ["a", "b", "c"]
    r = run_kafkajs(dict(bootstrap=tls_broker.bootstrap, ca=tls_broker.cert_path(),
                         mechanism=mechanism, user="alice", password=SCRAM_USERS["alice"][0],
                         topic=topic, values=values))
    assert r == {"ok": True, "high": "3"}, r


def test_kafkajs_wrong_scram_password_is_refused(tls_broker, topic):
    r = run_kafkajs(dict(bootstrap=tls_broker.bootstrap, ca=tls_broker.cert_path(),
                         mechanism="scram-sha-256", user="alice", password="wrong",
                         topic=topic, values=["x"]))
    assert not r["ok"] and "SASL" in r["name"] + r["message"], r


def test_kafkajs_client_certificate(tls_broker, pki, topic):
    r = run_kafkajs(dict(bootstrap=tls_broker.bootstrap, ca=tls_broker.cert_path(),
                         cert=pki["cert"], key=pki["key"], topic=topic, values=["z"]))
    assert r == {"ok": True, "high": "1"}, r
    assert topic in topics_seen(scram_conf(tls_broker, "carol", "SCRAM-SHA-256"))


# ----------------------------------------------- SCRAM in the clear, and byte quotas

QUOTA_BYTES_PER_S = 200_000


@pytest.fixture(scope="module")
def quota_broker():
    text = f"[quotas]\nbytes_per_s = {QUOTA_BYTES_PER_S}\n\n"
    text += scram_entry("alice", SCRAM_USERS["alice"][0], "000000000000", "SCRAM-SHA-256")
    b = ConfiguredBroker(text)
    yield b
    b.remove()


def test_scram_over_plaintext_and_the_byte_quota_slows_a_producer(quota_broker, topic):
    """SASL_PLAINTEXT with SCRAM; and an account over its byte rate is slowed down (its
    requests wait, as Kafka's quotas delay answers), not failed: every record arrives."""
    from confluent_kafka import Producer

    conf = {
        "bootstrap.servers": quota_broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": SCRAM_USERS["alice"][0],
    }
    produce_and_read_back(conf, topic, [b"warm-up"])
    # Each shard allows its share (rate / 2 shards); a connection is served by one shard.
    share = QUOTA_BYTES_PER_S // 2
    value = b"q" * (share // 2)
    n = 8  # 4 seconds' worth of this shard's share
    p = Producer(dict(conf, **{"linger.ms": 0}))
    errors = []
    start = time.time()
    for _ in range(n):
        p.produce(topic, value, on_delivery=lambda e, m: e and errors.append(e))
        assert p.flush(30) == 0
    elapsed = time.time() - start
    print(f"byte quota: {n} x {len(value)} bytes produced in {elapsed:.2f} s")
    assert not errors, errors
    # A full bucket lets one second's worth through at once; the rest waits for the rate.
    assert elapsed >= 2.0, f"{n} x {len(value)} bytes in {elapsed:.2f} s: not throttled"
