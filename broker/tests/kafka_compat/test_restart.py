"""Committed offsets and produced records survive a broker restart: a group resumes where it
committed, and a producer's acknowledged (acks=all) records are all there."""

import time

from conftest import Broker, create_topic


def test_a_group_resumes_from_committed_offsets_after_a_restart(topic, group):
    from confluent_kafka import Consumer, Producer, TopicPartition

    b = Broker()
    try:
        create_topic(b, topic, 2)
        p = Producer(b.confluent(**{"enable.idempotence": True, "acks": "all"}))
        for i in range(30):
            p.produce(topic, key=f"k{i % 5}", value=f"a{i}")
        assert p.flush(20) == 0

        def consumer():
            c = Consumer(b.confluent(**{
                "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
            }))
            c.subscribe([topic])
            return c

        c = consumer()
        got = []
        end = time.time() + 30
        while len(got) < 30 and time.time() < end:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        assert len(got) == 30
        c.commit(asynchronous=False)
        committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        assert sum(tp.offset for tp in committed) == 30
        c.close()

        b.restart()

        p = Producer(b.confluent(**{"enable.idempotence": True, "acks": "all"}))
        for i in range(10):
            p.produce(topic, key=f"k{i % 5}", value=f"b{i}")
        assert p.flush(20) == 0
        c = consumer()
        after = []
        end = time.time() + 30
        while len(after) < 10 and time.time() < end:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                after.append(m.value())
        # Only what came after the commit: nothing before it is read again.
        assert sorted(after) == sorted(f"b{i}".encode() for i in range(10))
        assert c.poll(1.0) is None
        c.close()
    finally:
        b.remove()
