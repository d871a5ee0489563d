"""The Kafka admin API from stock clients: confluent-kafka's AdminClient (librdkafka) and
kafkajs' admin (Node, installed from the npm registry by ci/install-deps.sh into target/node):
partitions added, groups listed, described and deleted, offsets fetched, configs altered and
kept across a restart, records deleted, the cluster described; and a second account's
clients see none of the first's topics or groups in any listing."""

import json
import os
import subprocess
import time

import pytest
from conftest import ACCESS_KEY, SECRET_KEY, TENANT_B, create_topic

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
NODE_MODULES = os.path.join(REPO, "target", "node", "node_modules")
ADMIN_JS = os.path.join(os.path.dirname(__file__), "js", "admin.js")


def kafkajs(broker, mode, user=ACCESS_KEY, password=SECRET_KEY, **extra):
    """Runs js/admin.js in `mode`; returns the JSON object it prints last."""
    if not os.path.isdir(os.path.join(NODE_MODULES, "kafkajs")):
        pytest.fail("kafkajs is not installed under target/node: run ci/install-deps.sh")
    env = dict(
        os.environ,
        NODE_PATH=NODE_MODULES,
        BOOTSTRAP=broker.bootstrap,
        KAFKA_USER=user,
        KAFKA_PASSWORD=password,
        MODE=mode,
        **extra,
    )
    p = subprocess.run(["node", ADMIN_JS], env=env, capture_output=True, timeout=180)
    assert p.returncode == 0, p.stderr.decode() + p.stdout.decode()
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def consume(consumer, n, timeout_s=30):
    got = []
    end = time.time() + timeout_s
    while len(got) < n and time.time() < end:
        m = consumer.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    return got


def b_confluent(broker, **extra):
    return broker.confluent(**{"sasl.username": TENANT_B[0], "sasl.password": TENANT_B[1], **extra})


def test_confluent_admin_partitions_groups_records_cluster(broker, topic, group):
    from confluent_kafka import (
        Consumer, ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException, Producer,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient(broker.confluent())
    create_topic(broker, topic, 1)
    # CreatePartitions: 1 -> 3; asking for fewer is refused.
    for f in admin.create_partitions([NewPartitions(topic, 3)]).values():
        f.result(timeout=20)
    assert len(admin.list_topics(topic=topic, timeout=10).topics[topic].partitions) == 3
    with pytest.raises(KafkaException):
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(timeout=20)

    p = Producer(broker.confluent())
    for i in range(10):
        p.produce(topic, value=b"v%d" % i, partition=0)
    assert p.flush(20) == 0

    c = Consumer(broker.confluent(**{
        "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
    }))
    c.subscribe([topic])
    assert len(consume(c, 10)) == 10
    c.commit(asynchronous=False)
    # A member: described Stable with its assignment; the group cannot be deleted.
    desc = admin.describe_consumer_groups([group])[group].result(timeout=20)
    assert desc.state == ConsumerGroupState.STABLE
    assert len(desc.members) == 1
    assert {tp.topic for tp in desc.members[0].assignment.topic_partitions} == {topic}
    with pytest.raises(KafkaException):
        admin.delete_consumer_groups([group])[group].result(timeout=20)
    c.close()
    listed = admin.list_consumer_groups().result(timeout=20)
    assert group in [g.group_id for g in listed.valid]
    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)]
    )[group].result(timeout=20)
    assert {(tp.partition, tp.offset) for tp in offsets.topic_partitions if tp.topic == topic} >= {(0, 10)}

    # DeleteRecords: the low watermark moves to 4; consumers start there.
    res = admin.delete_records([TopicPartition(topic, 0, 4)])
    deleted = list(res.values())[0].result(timeout=20)
    assert deleted.low_watermark == 4
    fresh = Consumer(broker.confluent(**{"group.id": group + "-fresh", "auto.offset.reset": "earliest"}))
    assert fresh.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (4, 10)
    fresh.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
    first = consume(fresh, 1)
    assert first and first[0].offset() == 4
    fresh.close()

    cluster = admin.describe_cluster().result(timeout=20)
    assert cluster.cluster_id == "sluice"
    assert [n.port for n in cluster.nodes] == [broker.port]

    # With no member left: deleted, and no longer listed.
    admin.delete_consumer_groups([group])[group].result(timeout=20)
    listed = admin.list_consumer_groups().result(timeout=20)
    assert group not in [g.group_id for g in listed.valid]


def test_confluent_configs_alter_and_survive_a_restart(broker, topic):
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    create_topic(broker, topic, 1)
    admin = AdminClient(broker.confluent())

    def described():
        r = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        return {k: e.value for k, e in list(r.values())[0].result(timeout=20).items()}

    inc = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
    ])
    for f in admin.incremental_alter_configs([inc]).values():
        f.result(timeout=20)
    assert described()["retention.ms"] == "7200000"
    # AlterConfigs (whole set): what it does not name goes back to the default.
    legacy = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.bytes": "1048576"})
    for f in admin.alter_configs([legacy]).values():
        f.result(timeout=20)
    cfg = described()
    assert (cfg["retention.bytes"], cfg["retention.ms"]) == ("1048576", "-1")
    # A config Sluice does not keep is refused, not silently dropped.
    bad = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.insync.replicas", "2", incremental_operation=AlterConfigOpType.SET),
    ])
    with pytest.raises(Exception):
        for f in admin.incremental_alter_configs([bad]).values():
            f.result(timeout=20)
    broker.restart()
    admin = AdminClient(broker.confluent())
    assert described()["retention.bytes"] == "1048576"


def test_kafkajs_admin_groups_offsets_partitions(broker, topic, group):
    create_topic(broker, topic, 1)
    out = kafkajs(broker, "flow", TOPIC=topic, GROUP=group)
    assert out["consumed"] == 6
    assert {"groupId": group, "protocolType": "consumer"} in out["listed"]
    active = out["describedActive"][0]
    assert active["groupId"] == group and active["state"] == "Stable"
    assert active["protocolType"] == "consumer" and len(active["members"]) == 1
    after = out["describedAfter"][0]
    assert after["state"] == "Empty" and after["members"] == []
    assert out["offsets"] == [
        {"topic": topic, "partitions": [{"partition": 0, "offset": "6", "metadata": ""}]}
    ] or out["offsets"][0]["partitions"][0]["offset"] == "6"
    # createPartitions resolves to nothing; the new count shows in the metadata.
    assert out["partitions"] == 4
    assert out["deleted"][0]["groupId"] == group and out["deleted"][0]["errorCode"] == "NONE" \
        or out["deleted"][0].get("error") is None
    assert group not in [g["groupId"] for g in out["listedAfterDelete"]]


def test_a_second_account_sees_none_of_the_firsts_topics_or_groups(broker, topic, group):
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    create_topic(broker, topic, 2)
    c = Consumer(broker.confluent(**{"group.id": group, "enable.auto.commit": False}))
    c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    c.close()
    mine = AdminClient(broker.confluent())
    assert group in [g.group_id for g in mine.list_consumer_groups().result(timeout=20).valid]

    theirs = AdminClient(b_confluent(broker))
    assert topic not in theirs.list_topics(timeout=10).topics
    assert group not in [g.group_id for g in theirs.list_consumer_groups().result(timeout=20).valid]
    try:
        d = theirs.describe_consumer_groups([group])[group].result(timeout=20)
        assert d.members == [] and str(d.state).upper().endswith("DEAD"), d
    except KafkaException:
        pass  # GROUP_ID_NOT_FOUND: not there, as far as this account can tell
    with pytest.raises(KafkaException):
        r = theirs.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        list(r.values())[0].result(timeout=20)
    cluster = theirs.describe_cluster().result(timeout=20)
    assert [n.port for n in cluster.nodes] == [broker.port]

    seen = kafkajs(broker, "look", user=TENANT_B[0], password=TENANT_B[1], GROUP=group)
    assert topic not in seen["topics"]
    assert group not in [g["groupId"] for g in seen["groups"]]
    assert seen["described"][0]["members"] == []
    assert seen["described"][0]["state"] in ("Dead", "")
    own = kafkajs(broker, "look", GROUP=group)
    assert topic in own["topics"]
    assert group in [g["groupId"] for g in own["groups"]]
