"""Kafka share groups (KIP-932) on a Sluice queue with confluent-kafka's ShareConsumer: a group
of three drains an SQS queue with explicit acknowledge, release and reject while an SQS
receiver (boto3) shares the queue. Promised: no message is held by two consumers at once;
each is processed once (accepted or deleted) unless released (then it comes back with a
higher delivery count, one count across both protocols) or rejected (then it is in the DLQ).
Random choices take their seed from SLUICE_SEED (printed on failure)."""

import os
import random
import time
import uuid

import pytest

MESSAGES = 60
# Longer than the test: only explicit acts end a lock here.
VISIBILITY_TIMEOUT_S = 300
DRAIN_DEADLINE_S = 120


def sqs_client(broker):
    import boto3

    from conftest import ACCESS_KEY, SECRET_KEY

    return boto3.client(
        "sqs", endpoint_url=f"http://127.0.0.1:{broker.ports[0]}", region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)


def test_a_share_group_of_three_and_an_sqs_receiver_drain_one_queue(broker):
    import confluent_kafka
    from confluent_kafka import AcknowledgeType

    if not hasattr(confluent_kafka, "ShareConsumer"):
        pytest.skip("this confluent-kafka has no ShareConsumer")
    seed = int(os.environ.get("SLUICE_SEED", str(time.time_ns())))
    rng = random.Random(seed)
    try:
        drain(broker, rng, AcknowledgeType)
    except BaseException:
        print(f"failed with SLUICE_SEED={seed}")
        raise


def drain(broker, rng, AcknowledgeType):
    from confluent_kafka import ShareConsumer

    sqs = sqs_client(broker)
    name = "sq-" + uuid.uuid4().hex[:12]
    dlq = sqs.create_queue(QueueName=name + "-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName=name, Attributes={
        "VisibilityTimeout": str(VISIBILITY_TIMEOUT_S),
        "RedrivePolicy": '{"deadLetterTargetArn":"%s","maxReceiveCount":"10"}' % dlq_arn,
    })["QueueUrl"]
    bodies = [f"m{i:03}" for i in range(MESSAGES)]
    for b in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=b)

    group = "sg-" + uuid.uuid4().hex[:12]
    consumers = []
    for _ in range(3):
        c = ShareConsumer(broker.confluent(**{
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }))
        c.subscribe([f"queue:{name}"])
        consumers.append(c)

    held = {}         # body -> holder
    processed = {}    # body -> times accepted/deleted
    rejected = set()
    released = {}     # body -> times released
    last_count = {}   # body -> the highest delivery count seen
    by_kind = {}      # acknowledge type -> how many the share consumers sent
    sqs_held = []     # (body, receipt handle, count): held across the consumers' polls
    deadline = time.time() + DRAIN_DEADLINE_S
    try:
        while time.time() < deadline:
            for i, c in enumerate(consumers):
                msgs = c.poll(0.5)
                acks = []
                for m in msgs:
                    assert m.error() is None, m.error()
                    body = m.value().decode()
                    assert body not in held, f"{body} given to consumer {i} while {held[body]} holds it"
                    held[body] = f"share-{i}"
                    count = m.delivery_count()
                    assert count > last_count.get(body, 0), (body, count, last_count.get(body))
                    last_count[body] = count
                    roll = rng.randrange(10)
                    if roll == 0 and count < 3:
                        kind = AcknowledgeType.RELEASE
                    elif roll == 1:
                        kind = AcknowledgeType.REJECT
                    else:
                        kind = AcknowledgeType.ACCEPT
                    c.acknowledge(m, kind)
                    acks.append((body, kind))
                if acks:
                    results = c.commit_sync(30)
                    for tp, err in results.items():
                        assert err is None, (tp, err)
                    for body, kind in acks:
                        by_kind[kind] = by_kind.get(kind, 0) + 1
                        del held[body]
                        if kind == AcknowledgeType.ACCEPT:
                            processed[body] = processed.get(body, 0) + 1
                        elif kind == AcknowledgeType.RELEASE:
                            released[body] = released.get(body, 0) + 1
                        else:
                            rejected.add(body)
            # The SQS receiver shares the queue: what it took last round it deletes or
            # hands back now; what it takes now it holds while the share consumers poll.
            for body, handle, count in sqs_held:
                del held[body]
                if rng.randrange(5) == 0 and count < 3:
                    sqs.change_message_visibility(
                        QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
                    released[body] = released.get(body, 0) + 1
                else:
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
                    processed[body] = processed.get(body, 0) + 1
            sqs_held = []
            r = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3,
                                    AttributeNames=["ApproximateReceiveCount"])
            for m in r.get("Messages", []):
                body = m["Body"]
                assert body not in held, f"{body} received by SQS while {held[body]} holds it"
                held[body] = "sqs"
                count = int(m["Attributes"]["ApproximateReceiveCount"])
                assert count > last_count.get(body, 0), (body, count, last_count.get(body))
                last_count[body] = count
                sqs_held.append((body, m["ReceiptHandle"], count))
            done = sum(processed.values()) + len(rejected)
            if done == MESSAGES and not held:
                break
    finally:
        for c in consumers:
            c.close()

    assert not held, held
    # The share consumers took part with every kind of acknowledgement.
    assert set(by_kind) == {AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE,
                            AcknowledgeType.REJECT}, by_kind
    for b in bodies:
        n = processed.get(b, 0) + (1 if b in rejected else 0)
        assert n == 1, (b, processed.get(b), b in rejected)
    for b, times in released.items():
        assert last_count[b] > times, (b, times, last_count[b])
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
    in_dlq = set()
    while True:
        r = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)
        if not r.get("Messages"):
            break
        in_dlq.update(m["Body"] for m in r["Messages"])
    assert in_dlq == rejected
