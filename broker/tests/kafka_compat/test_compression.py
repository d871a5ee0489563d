"""Compressed batches (gzip, snappy, lz4, zstd) from every client the suite drives: librdkafka
(confluent-kafka and kcat), kafka-python, aiokafka and kafkajs (Node). Every record is read
back, by clients that decompress themselves (sluiced serves batches compressed as stored).
Bad input over raw frames: compression bombs and corrupt compressed batches get a typed error,
nothing is stored, the connection goes on, and sluiced's memory stays bounded."""

import asyncio
import json
import os
import struct
import subprocess
import time
import zlib

import pytest
from conftest import ACCESS_KEY, SECRET_KEY, Raw, create_topic, parse_produce_v3, produce_v3

CODECS = ["gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CORRUPT_MESSAGE = 2
INVALID_RECORD = 87
# What a bomb decompresses to: far past sluiced's bound (DECOMPRESSED_BATCH_BYTES_MAX, 16 MiB).
# Snappy compresses 21:1 at best, so its bomb is smaller: it must fit one request (16 MiB).
BOMB_BYTES = {"gzip": 512 << 20, "lz4": 512 << 20, "zstd": 512 << 20, "snappy": 128 << 20}
# sluiced's decompression budget per shard (DECOMPRESSION_SHARD_BYTES_MAX: 2 x 32 MiB);
# its RSS may grow by that at most while bombs arrive, never by a bomb's size.
DECOMPRESSION_SHARD_BYTES_MAX = 64 << 20
NODE_MODULES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "target", "node-kafka",
                            "node_modules")


def value(client, codec, i):
    # Text compresses, as production payloads do.
    return f"{client} {codec} #{i} ".encode() + b"lorem ipsum dolor sit amet " * 20


def read_all_confluent(broker, topic, n, timeout_s=30):
    """(key, value, headers) of every record of `topic`, read by librdkafka from the start."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(broker.confluent(**{"group.id": "reader-" + topic, "enable.auto.commit": False}))
    meta = c.list_topics(topic, timeout=10)
    parts = list(meta.topics[topic].partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    got = []
    end = time.time() + timeout_s
    while len(got) < n and time.time() < end:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append((m.key(), m.value(), dict(m.headers() or [])))
    c.close()
    return got


def read_all_kafka_python(broker, topic, n, timeout_s=30):
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, **broker.kafka_python(auto_offset_reset="earliest",
                                                   enable_auto_commit=False,
                                                   consumer_timeout_ms=timeout_s * 1000))
    got = []
    for m in c:
        got.append((m.key, m.value, dict(m.headers)))
        if len(got) >= n:
            break
    c.close()
    return got


def produce_confluent(broker, topic, codec, n):
    from confluent_kafka import Producer

    p = Producer(broker.confluent(**{"compression.type": codec, "linger.ms": 50,
                                     "enable.idempotence": True}))
    sent = []
    for i in range(n):
        v = value("confluent", codec, i)
        p.produce(topic, key=f"k{i % 3}".encode(), value=v, headers=[("codec", codec.encode())])
        sent.append(v)
    assert p.flush(30) == 0
    return sent


def produce_kafka_python(broker, topic, codec, n):
    from kafka import KafkaProducer

    p = KafkaProducer(**broker.kafka_python(compression_type=codec, linger_ms=50, acks="all"))
    futures, sent = [], []
    for i in range(n):
        v = value("kafka-python", codec, i)
        futures.append(p.send(topic, key=f"k{i % 3}".encode(), value=v,
                              headers=[("codec", codec.encode())]))
        sent.append(v)
    p.flush()
    for f in futures:
        f.get(timeout=30)
    p.close()
    return sent


def produce_aiokafka(broker, topic, codec, n):
    from aiokafka import AIOKafkaProducer

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username=ACCESS_KEY,
                             sasl_plain_password=SECRET_KEY, compression_type=codec,
                             linger_ms=50, acks="all")
        await p.start()
        sent, futs = [], []
        try:
            for i in range(n):
                v = value("aiokafka", codec, i)
                futs.append(await p.send(topic, key=f"k{i % 3}".encode(), value=v,
                                         headers=[("codec", codec.encode())]))
                sent.append(v)
            for f in futs:
                await f
        finally:
            await p.stop()
        return sent

    return asyncio.run(run())


def produce_kcat(broker, topic, codec, n):
    sent = [value("kcat", codec, i) for i in range(n)]
    r = broker.kcat("-P", "-t", topic, "-z", codec, "-H", f"codec={codec}",
                    input=b"\n".join(sent) + b"\n")
    assert r.returncode == 0, r.stderr
    return sent


PRODUCERS = {
    "confluent": produce_confluent,
    "kcat": produce_kcat,
    "kafka-python": produce_kafka_python,
    "aiokafka": produce_aiokafka,
}


@pytest.mark.parametrize("client", list(PRODUCERS))
def test_each_codec_from_each_python_and_librdkafka_client_reads_back_whole(broker, topic, client):
    """One topic per client, every codec into it (mixed codecs in one topic), every record
    read back by librdkafka and by kafka-python (each decompresses what is served)."""
    create_topic(broker, topic, 2)
    sent = []
    for codec in CODECS:
        sent += PRODUCERS[client](broker, topic, codec, 30)
    for reader in (read_all_confluent, read_all_kafka_python):
        got = reader(broker, topic, len(sent))
        assert sorted(v for _, v, _ in got) == sorted(sent), reader.__name__
        for _, v, headers in got:
            codec = v.split(b" ")[1].decode()
            assert headers.get("codec") == codec.encode(), (reader.__name__, v[:40])


def test_every_client_and_codec_into_one_topic_then_aiokafka_reads_all(broker, topic):
    create_topic(broker, topic, 3)
    sent = []
    for client, produce in PRODUCERS.items():
        for codec in CODECS:
            sent += produce(broker, topic, codec, 10)

    from aiokafka import AIOKafkaConsumer

    async def run():
        c = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap,
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             sasl_plain_username=ACCESS_KEY, sasl_plain_password=SECRET_KEY,
                             auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        got = []
        try:
            end = time.time() + 40
            while len(got) < len(sent) and time.time() < end:
                batch = await c.getmany(timeout_ms=500)
                for msgs in batch.values():
                    got += [m.value for m in msgs]
        finally:
            await c.stop()
        return got

    got = asyncio.run(run())
    assert sorted(got) == sorted(sent)


def test_kafkajs_sends_every_codec_mixed_with_plain_sends_and_reads_all_back(broker, topic, group):
    if not os.path.isdir(os.path.join(NODE_MODULES, "kafkajs")):
        pytest.fail(f"kafkajs is not installed under {NODE_MODULES}: run ci/install-deps.sh")
    create_topic(broker, topic, 2)
    script = os.path.join(os.path.dirname(__file__), "kafkajs_compat.js")
    r = subprocess.run(["node", script, broker.bootstrap, ACCESS_KEY, SECRET_KEY, topic, group],
                       env=dict(os.environ, NODE_PATH=os.path.abspath(NODE_MODULES)),
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert sorted(g["value"] for g in out["got"]) == sorted(out["sent"])
    assert {g["codec"] for g in out["got"]} == {"none", *CODECS}
    # Other clients read kafkajs' batches too (snappy without xerial framing, lz4js frames).
    got = read_all_confluent(broker, topic, len(out["sent"]))
    assert sorted(v.decode() for _, v, _ in got) == sorted(out["sent"])


# ---------------------------------------------------------------------------- raw frames


def varint(n):
    n = (n << 1) ^ (n >> 63)  # zigzag
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def record_prefix(value_len):
    """A Kafka v2 record's bytes before its value (offset delta 0, no key), and its tail."""
    body_len = 1 + 1 + 1 + 1 + len(varint(value_len)) + value_len + 1
    head = varint(body_len) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(value_len)
    return head, varint(0)


def compress_stream(codec, pieces):
    """`pieces` (an iterator of bytes) compressed with `codec` as a producer frames it, without
    holding the uncompressed whole in this process."""
    if codec == "gzip":
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        return b"".join(c.compress(p) for p in pieces) + c.flush()
    if codec == "zstd":
        import zstandard

        c = zstandard.ZstdCompressor(level=3).compressobj()
        return b"".join(c.compress(p) for p in pieces) + c.flush()
    if codec == "lz4":
        import lz4.frame

        c = lz4.frame.LZ4FrameCompressor()
        return c.begin() + b"".join(c.compress(p) for p in pieces) + c.flush()
    if codec == "snappy":
        # xerial framing, blocks of 32 KiB (one block repeated: the same bytes compress the same).
        import cramjam

        out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
        for p in pieces:
            for at in range(0, len(p), 32 * 1024):
                blk = bytes(cramjam.snappy.compress_raw(p[at:at + 32 * 1024]))
                out += struct.pack(">I", len(blk)) + blk
        return out
    raise ValueError(codec)


def kafka_batch(codec, payload, count=1):
    """A Kafka v2 batch around compressed `payload`, CRC32C right."""
    from kafka.record.util import calc_crc32c

    ts = int(time.time() * 1000)
    after_crc = (struct.pack(">hiqqqhii", CODEC_IDS[codec], count - 1, ts, ts, -1, -1, -1, count)
                 + payload)
    crc = calc_crc32c(after_crc)
    body = struct.pack(">iBI", -1, 2, crc) + after_crc
    return struct.pack(">qi", 0, len(body)) + body


def bomb(codec):
    size = BOMB_BYTES[codec]
    head, tail = record_prefix(size)
    zeros = b"\x00" * (4 * 1024 * 1024)

    def pieces():
        yield head
        for _ in range(size // len(zeros)):
            yield zeros
        yield tail

    return kafka_batch(codec, compress_stream(codec, pieces()))


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def produce_code(raw, topic, batch):
    _, body = raw.request(0, 3, produce_v3(topic, 0, batch))
    (_, code, base), = parse_produce_v3(body)
    return code, base


def test_bombs_and_corrupt_compressed_batches_are_refused_and_memory_stays_bounded(broker, topic):
    create_topic(broker, topic, 1)
    raw = Raw(broker)
    pid = broker.proc.pid
    # A good compressed batch first: sluiced's decompression path is warm before the baseline.
    head, tail = record_prefix(5)
    good = {c: kafka_batch(c, compress_stream(c, [head, b"hello", tail])) for c in CODECS}
    assert produce_code(raw, topic, good["zstd"]) == (0, 0)
    before = rss_bytes(pid)
    peak = before
    for codec in CODECS:
        b = bomb(codec)
        assert len(b) < 8 << 20, f"{codec} bomb is {len(b)} bytes on the wire"
        for _ in range(2):
            code, _ = produce_code(raw, topic, b)
            assert code == INVALID_RECORD, (codec, code)
            peak = max(peak, rss_bytes(pid))
        # Corrupt: garbage where the compressed records go, with a CRC that holds.
        junk = kafka_batch(codec, bytes(range(256)) * 4)
        assert produce_code(raw, topic, junk)[0] in (CORRUPT_MESSAGE, INVALID_RECORD), codec
        # Truncated: the good batch's compressed records cut short (CRC made right again).
        payload = good[codec][61:]
        cut = kafka_batch(codec, payload[: len(payload) // 2])
        assert produce_code(raw, topic, cut)[0] == CORRUPT_MESSAGE, codec
        # A flipped byte without a new CRC.
        flipped = bytearray(good[codec])
        flipped[-2] ^= 0x10
        assert produce_code(raw, topic, bytes(flipped))[0] == CORRUPT_MESSAGE, codec
    growth = peak - before
    print(f"sluiced RSS {before >> 20} MiB before the bombs, peak {peak >> 20} MiB")
    assert growth < DECOMPRESSION_SHARD_BYTES_MAX, \
        f"sluiced grew by {growth >> 20} MiB decompressing bombs of up to 512 MiB"
    # Nothing bad was stored, and the connection goes on: the next offsets are 1, 2, 3...
    for i, codec in enumerate(CODECS):
        assert produce_code(raw, topic, good[codec]) == (0, 1 + i), codec
    raw.close()
    got = read_all_confluent(broker, topic, 5)
    assert [v for _, v, _ in got] == [b"hello"] * 5
    assert broker.alive()
