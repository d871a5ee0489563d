"""Kafka transactions with stock clients: a confluent-kafka transactional producer's committed
records are read and its aborted ones never are under read_committed, across a broker restart
and a fenced zombie producer; a transaction left open past transaction.timeout.ms is aborted by
the broker; a kcat read_committed consumer agrees with confluent-kafka's; a transactional
consume-process-produce loop commits its offsets with the transaction."""

import subprocess
import time
import uuid

import pytest

from conftest import Broker, create_topic


def txn_producer(b, txn_id, timeout_ms=60000):
    from confluent_kafka import Producer

    p = Producer(b.confluent(**{
        "transactional.id": txn_id,
        "transaction.timeout.ms": timeout_ms,
        "enable.idempotence": True,
        "acks": "all",
    }))
    p.init_transactions(30)
    return p


def read_all(b, topic, isolation, expect=None, seconds=15):
    """Every record value on `topic` (one partition or more) read from the start."""
    from confluent_kafka import Consumer

    c = Consumer(b.confluent(**{
        "group.id": "r-" + uuid.uuid4().hex[:12],
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": isolation,
    }))
    c.subscribe([topic])
    got = []
    end = time.time() + seconds
    idle_until = None
    while time.time() < end:
        m = c.poll(0.3)
        if m is None:
            # Done once the expected count is in and a quiet second passed.
            if expect is not None and len(got) >= expect:
                if idle_until is None:
                    idle_until = time.time() + 1.0
                elif time.time() > idle_until:
                    break
            continue
        if m.error() is not None:
            continue
        got.append(m.value().decode())
        idle_until = None
    c.close()
    return got


def kcat_read_committed(b, topic):
    out = b.kcat("-C", "-t", topic, "-o", "beginning", "-e", "-q",
                 "-X", "isolation.level=read_committed", "-f", "%s\n")
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    return [line for line in out.stdout.decode().splitlines() if line]


def test_committed_read_aborted_never_across_restart_and_zombie(topic):
    from confluent_kafka import KafkaException

    b = Broker()
    try:
        create_topic(b, topic, 2)
        txn_id = "txn-" + uuid.uuid4().hex[:8]
        p = txn_producer(b, txn_id)

        p.begin_transaction()
        for i in range(10):
            p.produce(topic, key=f"k{i}", value=f"c1-{i}")
        p.commit_transaction(30)

        p.begin_transaction()
        for i in range(10):
            p.produce(topic, key=f"k{i}", value=f"ab-{i}")
        p.flush(30)
        p.abort_transaction(30)

        committed = [f"c1-{i}" for i in range(10)]
        assert sorted(read_all(b, topic, "read_committed", expect=10)) == sorted(committed)
        # read_uncommitted sees the aborted ones too: they were written.
        assert len(read_all(b, topic, "read_uncommitted", expect=20)) == 20

        # A zombie: its transaction is open when a new producer of the same id starts.
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, key=f"k{i}", value=f"zombie-{i}")
        p.flush(30)
        fresh = txn_producer(b, txn_id)
        with pytest.raises(KafkaException):
            p.commit_transaction(20)
        fresh.begin_transaction()
        for i in range(5):
            fresh.produce(topic, key=f"k{i}", value=f"c2-{i}")
        fresh.commit_transaction(30)
        committed += [f"c2-{i}" for i in range(5)]

        # An open transaction across a restart, then aborted by the producer's successor.
        fresh.begin_transaction()
        for i in range(5):
            fresh.produce(topic, key=f"k{i}", value=f"open-{i}")
        fresh.flush(30)
        b.restart()

        got = read_all(b, topic, "read_committed", expect=len(committed))
        assert sorted(got) == sorted(committed), got
        assert sorted(kcat_read_committed(b, topic)) == sorted(committed)

        after = txn_producer(b, txn_id)
        after.begin_transaction()
        for i in range(5):
            after.produce(topic, key=f"k{i}", value=f"c3-{i}")
        after.commit_transaction(30)
        committed += [f"c3-{i}" for i in range(5)]

        got = read_all(b, topic, "read_committed", expect=len(committed))
        assert sorted(got) == sorted(committed), got
        assert not any(v.startswith(("ab-", "zombie-", "open-")) for v in got)
        assert sorted(kcat_read_committed(b, topic)) == sorted(committed)
    finally:
        b.remove()


def test_a_timed_out_transaction_is_aborted_by_the_broker(broker, topic):
    from confluent_kafka import KafkaException

    create_topic(broker, topic, 1)
    p = txn_producer(broker, "hung-" + uuid.uuid4().hex[:8], timeout_ms=1000)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"hung-{i}")
    p.flush(30)
    # The producer hangs; the broker aborts at the timeout, so the LSO moves on and later
    # committed records are readable.
    time.sleep(3)
    other = txn_producer(broker, "other-" + uuid.uuid4().hex[:8])
    other.begin_transaction()
    other.produce(topic, value="after")
    other.commit_transaction(30)
    assert read_all(broker, topic, "read_committed", expect=1) == ["after"]
    assert kcat_read_committed(broker, topic) == ["after"]
    with pytest.raises(KafkaException):
        p.commit_transaction(20)


def test_offsets_commit_with_the_transaction(broker, topic, group):
    from confluent_kafka import Consumer, TopicPartition

    src = topic
    dst = topic + "-out"
    create_topic(broker, src, 1)
    create_topic(broker, dst, 1)
    from confluent_kafka import Producer

    plain = Producer(broker.confluent())
    for i in range(6):
        plain.produce(src, value=f"in-{i}")
    assert plain.flush(20) == 0

    c = Consumer(broker.confluent(**{
        "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": "read_committed",
    }))
    c.subscribe([src])
    got = []
    end = time.time() + 20
    while len(got) < 6 and time.time() < end:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m)
    assert len(got) == 6
    p = txn_producer(broker, "eos-" + uuid.uuid4().hex[:8])
    p.begin_transaction()
    for m in got:
        p.produce(dst, value=m.value().decode().replace("in", "out"))
    p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 20)
    p.commit_transaction(30)
    committed = c.committed([TopicPartition(src, 0)], timeout=10)
    assert committed[0].offset == 6
    c.close()
    assert sorted(read_all(broker, dst, "read_committed", expect=6)) == sorted(
        f"out-{i}" for i in range(6))
