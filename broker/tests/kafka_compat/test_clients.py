"""Real Kafka clients against sluiced: kcat (Debian's librdkafka), confluent-kafka (its own
librdkafka) and kafka-python (pure Python), all over SASL/PLAIN."""

import gc
import json
import time

import pytest
from conftest import TENANT_B, create_topic


def consume_all(consumer, n, timeout_s=20):
    got = []
    end = time.time() + timeout_s
    while len(got) < n and time.time() < end:
        m = consumer.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    return got


def test_kcat_lists_produces_keyed_with_acks_all_and_consumes(broker, topic):
    create_topic(broker, topic, 3)
    meta = broker.kcat("-L", "-J", "-t", topic)
    assert meta.returncode == 0, meta.stderr
    m = json.loads(meta.stdout)
    assert [t["topic"] for t in m["topics"]] == [topic]
    assert len(m["topics"][0]["partitions"]) == 3
    lines = "".join(f"k{i % 4}:v{i}\n" for i in range(40)).encode()
    p = broker.kcat("-P", "-t", topic, "-K:", "-X", "acks=all", "-X", "enable.idempotence=true", input=lines)
    assert p.returncode == 0, p.stderr
    c = broker.kcat("-C", "-t", topic, "-e", "-J", "-o", "beginning")
    assert c.returncode == 0, c.stderr
    recs = [json.loads(line) for line in c.stdout.decode().splitlines() if line.strip()]
    assert sorted(r["payload"] for r in recs) == sorted(f"v{i}" for i in range(40))
    # One key, one partition; per partition, offsets are 0.. in produce order.
    by_key = {}
    for r in recs:
        by_key.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(ps) == 1 for ps in by_key.values())
    for part in range(3):
        offs = [r["offset"] for r in recs if r["partition"] == part]
        assert offs == list(range(len(offs)))
    values = [r["payload"] for r in recs if r["key"] == "k1"]
    assert values == [f"v{i}" for i in range(40) if i % 4 == 1]


def test_kafka_python_admin_produce_idempotent_and_seek_by_timestamp(broker, topic):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(**broker.kafka_python())
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1,
                                  topic_configs={"retention.ms": "3600000"})])
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    cfg = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    assert "3600000" in repr(cfg)
    assert topic in admin.list_topics()

    prod = KafkaProducer(**broker.kafka_python(acks="all", enable_idempotence=True))
    t0 = int(time.time() * 1000) - 60_000
    for i in range(20):
        # Two halves a minute apart: a seek by the second half's time skips the first.
        ts = t0 + (0 if i < 10 else 30_000)
        prod.send(topic, key=b"same", value=f"v{i}".encode(), timestamp_ms=ts)
    prod.flush()
    prod.close()

    c = KafkaConsumer(**broker.kafka_python())
    parts = [TopicPartition(topic, p) for p in (0, 1)]
    ends = c.end_offsets(parts)
    assert sorted(ends.values()) == [0, 20], "one key, one partition, no duplicates"
    tp = next(p for p in parts if ends[p] == 20)
    at = c.offsets_for_times({tp: t0 + 10_000})[tp]
    assert (at.offset, at.timestamp) == (10, t0 + 30_000)
    assert c.offsets_for_times({tp: t0 + 3_600_000})[tp] is None, "after the last record"
    c.assign([tp])
    c.seek(tp, at.offset)
    got = []
    end = time.time() + 10
    while len(got) < 10 and time.time() < end:
        for recs in c.poll(timeout_ms=500).values():
            got.extend(r.value.decode() for r in recs)
    assert got == [f"v{i}" for i in range(10, 20)]
    c.close()
    admin.delete_topics([topic])
    assert topic not in admin.list_topics()
    admin.close()


def test_confluent_group_of_two_rebalances_when_one_leaves(broker, topic, group):
    from confluent_kafka import Consumer, Producer

    create_topic(broker, topic, 4)
    p = Producer(broker.confluent(**{"enable.idempotence": True, "acks": "all"}))
    for i in range(200):
        p.produce(topic, key=f"k{i % 16}", value=f"v{i}")
    assert p.flush(20) == 0

    def member():
        c = Consumer(broker.confluent(**{
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }))
        c.subscribe([topic])
        return c

    a, b = member(), member()
    seen = {}
    end = time.time() + 45
    # Both poll until the group has settled with two members that split the partitions.
    while time.time() < end:
        for c in (a, b):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                seen[(m.partition(), m.offset())] = m.value()
        ia, ib = a.assignment(), b.assignment()
        if ia and ib and len(ia) + len(ib) == 4 and len(seen) == 200:
            break
    ia, ib = {tp.partition for tp in a.assignment()}, {tp.partition for tp in b.assignment()}
    assert ia and ib and not (ia & ib) and ia | ib == {0, 1, 2, 3}, (ia, ib)
    assert sorted(seen.values()) == sorted(f"v{i}".encode() for i in range(200))
    a.commit(asynchronous=False)
    b.commit(asynchronous=False)
    b.close()  # LeaveGroup: a takes every partition
    end = time.time() + 30
    while time.time() < end and len(a.assignment()) != 4:
        a.poll(0.2)
    assert {tp.partition for tp in a.assignment()} == {0, 1, 2, 3}
    # Everything was committed: nothing is read again.
    assert consume_all(a, 1, timeout_s=2) == []
    a.close()


def test_a_wrong_password_is_refused_and_tenants_do_not_see_each_other(broker, topic):
    from confluent_kafka.admin import AdminClient

    create_topic(broker, topic, 1)
    # Few attempts, and the client gone after: the broker counts failed logins per address and
    # refuses every login from it past a burst (kafka/sasl.rs), and this suite's clients share
    # 127.0.0.1 -- a client left retrying in the background locked out the next test's logins.
    bad = AdminClient(broker.confluent(**{
        "sasl.password": "wrong",
        "reconnect.backoff.ms": 2000,
        "reconnect.backoff.max.ms": 10000,
    }))
    with pytest.raises(Exception):
        bad.list_topics(timeout=5)
    del bad
    gc.collect()
    akid, secret, _ = TENANT_B
    other = AdminClient(broker.confluent(**{"sasl.username": akid, "sasl.password": secret}))
    assert topic not in other.list_topics(timeout=10).topics
    mine = AdminClient(broker.confluent())
    assert topic in mine.list_topics(timeout=10).topics


def test_kafka_python_group_of_two_splits_then_one_takes_all(broker, topic, group):
    import threading

    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import CommitFailedError, KafkaError

    errors = []
    create_topic(broker, topic, 4)
    prod = KafkaProducer(**broker.kafka_python(acks="all"))
    for i in range(100):
        prod.send(topic, key=f"k{i % 10}".encode(), value=f"v{i}".encode())
    prod.flush()
    prod.close()
    seen = {}
    lock = threading.Lock()
    stop = {"b": threading.Event(), "a": threading.Event()}
    assignments = {}

    def run(name):
        c = KafkaConsumer(**broker.kafka_python(
            group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
            session_timeout_ms=6000, heartbeat_interval_ms=500))
        # Metadata first: kafka-python's leader assigns from its cached metadata, and a topic
        # created a moment ago may not be there yet (it then assigns nothing; so does Kafka).
        assert c.partitions_for_topic(topic) == {0, 1, 2, 3}
        c.subscribe([topic])
        while not stop[name].is_set():
            for recs in c.poll(timeout_ms=200).values():
                with lock:
                    for r in recs:
                        seen[(r.partition, r.offset)] = r.value
            try:
                c.commit()
            except (CommitFailedError, KafkaError) as e:
                # A rebalance under way: the next poll joins again (kafka-python raises here).
                errors.append(repr(e))
            assignments[name] = {tp.partition for tp in c.assignment()}
        c.close()

    # Daemon threads: a failed assertion below must not leave pytest waiting on them forever.
    threads = {n: threading.Thread(target=run, args=(n,), daemon=True) for n in ("a", "b")}
    for t in threads.values():
        t.start()
    end = time.time() + 45
    while time.time() < end:
        a, b = assignments.get("a", set()), assignments.get("b", set())
        if a and b and a | b == {0, 1, 2, 3} and not a & b and len(seen) == 100:
            break
        time.sleep(0.2)
    a, b = assignments.get("a", set()), assignments.get("b", set())
    assert a and b and a | b == {0, 1, 2, 3} and not a & b, (a, b, errors)
    stop["b"].set()
    threads["b"].join(20)
    end = time.time() + 30
    while time.time() < end and assignments.get("a") != {0, 1, 2, 3}:
        time.sleep(0.2)
    assert assignments.get("a") == {0, 1, 2, 3}
    stop["a"].set()
    threads["a"].join(20)
    assert sorted(seen.values()) == sorted(f"v{i}".encode() for i in range(100))


def test_a_queue_reads_as_a_stream_for_kafka_consumers(broker):
    import uuid

    import boto3
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from conftest import ACCESS_KEY, SECRET_KEY

    sqs = boto3.client(
        "sqs", endpoint_url=f"http://127.0.0.1:{broker.ports[0]}", region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
    name = "q-" + uuid.uuid4().hex[:12]
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    for i in range(6):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    # A receive and delete leaves engine records between the messages: still read past.
    r = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=r["Messages"][0]["ReceiptHandle"])
    for i in range(6, 8):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    stream = f"queue:{name}"
    c = Consumer(broker.confluent(**{"group.id": "qg-" + name, "enable.auto.commit": False}))
    parts = c.list_topics(stream, timeout=10).topics[stream].partitions
    assert len(parts) >= 1
    c.assign([TopicPartition(stream, p, OFFSET_BEGINNING) for p in parts])
    got = consume_all(c, 8)
    assert sorted(m.value() for m in got) == sorted(f"m{i}".encode() for i in range(8))
    c.close()
