"""Disk bytes and server CPU per record for Kafka producers with and without compression (not
a test: pytest does not collect it). Starts its own sluiced (SLUICE_BIN) as the suite does,
produces RECORDS text records with librdkafka per codec into a topic of its own, reads them
back, and prints per codec: the bytes the topic's log grew by per record, and sluiced's CPU
(user + system, /proc/<pid>/stat) per record for the produce and for the fetch.

    SLUICE_BIN=target/debug/sluiced target/py-venv/bin/python \\
        broker/tests/kafka_compat/measure_compression.py [RECORDS]
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from conftest import Broker, create_topic  # noqa: E402

CODECS = ["none", "lz4", "zstd", "gzip", "snappy"]
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def payload(i):
    # JSON-like text, as production payloads often are (compresses 3-10x).
    return (f'{{"id":{i},"user":"user-{i % 977}","event":"page_view","path":"/products/'
            f'{i % 131}","ua":"Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/121.0",'
            f'"ts":{1_700_000_000_000 + i}}}').encode()


def main():
    from confluent_kafka import Consumer, Producer, TopicPartition

    records = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    broker = Broker()
    pid = broker.proc.pid
    data = os.path.join(broker.dir, "d")
    print(f"{records} records of ~{len(payload(0))} bytes per codec; sluiced {broker.binary}")
    print("codec   disk B/record  produce CPU us/record  fetch CPU us/record")
    try:
        for codec in CODECS:
            topic = f"measure-{codec}"
            create_topic(broker, topic, 1)
            disk0, cpu0 = dir_bytes(data), cpu_s(pid)
            p = Producer(broker.confluent(**{"compression.type": codec, "linger.ms": 20,
                                             "batch.size": 1 << 20}))
            for i in range(records):
                while True:
                    try:
                        p.produce(topic, value=payload(i))
                        break
                    except BufferError:
                        p.poll(0.05)
            assert p.flush(60) == 0
            cpu1 = cpu_s(pid)
            time.sleep(0.5)
            disk1 = dir_bytes(data)
            c = Consumer(broker.confluent(**{"group.id": "m-" + codec,
                                             "enable.auto.commit": False}))
            c.assign([TopicPartition(topic, 0, 0)])
            n = 0
            while n < records:
                m = c.poll(1.0)
                if m is not None and m.error() is None:
                    n += 1
            c.close()
            cpu2 = cpu_s(pid)
            print(f"{codec:7} {(disk1 - disk0) / records:13.1f}  "
                  f"{(cpu1 - cpu0) / records * 1e6:21.2f}  {(cpu2 - cpu1) / records * 1e6:19.2f}")
    finally:
        broker.remove()


if __name__ == "__main__":
    main()
