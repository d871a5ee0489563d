"""SQS compatibility: the real sluiced against boto3 (AWS JSON 1.0), the AWS CLI and the Query
protocol (form + XML), all SigV4-signed."""

import base64
import hashlib
import json
import struct
import threading
import time

import botocore.exceptions
import pytest

from conftest import ACCOUNT, NS, QueryClient


def md5_of_attributes(attrs):
    """SQS's MD5OfMessageAttributes, written independently of the server."""
    h = hashlib.md5()
    for name in sorted(attrs):
        a = attrs[name]
        for part in (name.encode(), a["DataType"].encode()):
            h.update(struct.pack(">I", len(part)) + part)
        if "BinaryValue" in a:
            v = a["BinaryValue"]
            h.update(b"\x02" + struct.pack(">I", len(v)) + v)
        else:
            v = a["StringValue"].encode()
            h.update(b"\x01" + struct.pack(">I", len(v)) + v)
    return h.hexdigest()


def code(exc):
    return exc.value.response["Error"]["Code"]


ATTRS = {
    "s": {"DataType": "String", "StringValue": "héllo ✓"},
    "n": {"DataType": "Number", "StringValue": "-12.5e3"},
    "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
    "app.trace": {"DataType": "String.custom", "StringValue": "t-1"},
}


def test_queue_lifecycle_attributes_tags_and_listing(sqs, name):
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"}, tags={"team": "a"})["QueueUrl"]
    assert url.endswith(f"/{ACCOUNT}/{name}")
    # Idempotent with the same attributes, an error with different ones.
    assert sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "46"})
    assert code(e) == "QueueAlreadyExists"
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    for i in range(3):
        sqs.create_queue(QueueName=f"{name}-p{i}")
    got, token = [], None
    while True:
        kw = {"QueueNamePrefix": name + "-p", "MaxResults": 2}
        if token:
            kw["NextToken"] = token
        r = sqs.list_queues(**kw)
        got += r.get("QueueUrls", [])
        token = r.get("NextToken")
        if not token:
            break
    assert [u.rsplit("/", 1)[1] for u in got] == [f"{name}-p{i}" for i in range(3)]

    sqs.send_message(QueueUrl=url, MessageBody="one")
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert a["VisibilityTimeout"] == "45"
    assert a["QueueArn"] == f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"
    assert a["ApproximateNumberOfMessages"] == "1"
    assert a["ApproximateNumberOfMessagesDelayed"] == "1"
    assert a["ApproximateNumberOfMessagesNotVisible"] == "0"
    assert "FifoQueue" not in a
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "5", "ReceiveMessageWaitTimeSeconds": "1"})
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds", "QueueArn"])["Attributes"]
    assert a == {"DelaySeconds": "5", "QueueArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"}
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "901"})
    assert code(e) == "InvalidAttributeValue"

    sqs.tag_queue(QueueUrl=url, Tags={"env": "test", "team": "b"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test", "team": "b"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}

    sqs.purge_queue(QueueUrl=url)
    deadline = time.time() + 5
    while time.time() < deadline:
        a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
        if a["ApproximateNumberOfMessages"] == "0":
            break
        time.sleep(0.1)
    assert a["ApproximateNumberOfMessages"] == "0"
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as e:
        sqs.get_queue_url(QueueName=name)
    assert code(e) == "AWS.SimpleQueueService.NonExistentQueue"


def test_send_receive_md5s_attributes_visibility_delete(sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    body = "line1\r\nline2\t<&>\"' ünï 😀"
    r = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=ATTRS)
    assert r["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert r["MD5OfMessageAttributes"] == md5_of_attributes(ATTRS)
    m = sqs.receive_message(
        QueueUrl=url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"], VisibilityTimeout=30
    )["Messages"]
    assert len(m) == 1
    m = m[0]
    assert m["Body"] == body
    assert m["MD5OfBody"] == r["MD5OfMessageBody"]
    assert m["MessageId"] == r["MessageId"]
    assert m["MessageAttributes"] == ATTRS
    assert m["MD5OfMessageAttributes"] == md5_of_attributes(ATTRS)
    sa = m["Attributes"]
    assert sa["ApproximateReceiveCount"] == "1"
    assert abs(int(sa["SentTimestamp"]) / 1000 - time.time()) < 60
    assert int(sa["ApproximateFirstReceiveTimestamp"]) >= int(sa["SentTimestamp"])
    # In flight: nothing more to receive.
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    # Filters: a prefix and a name; the MD5 covers what is returned.
    m2 = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["app.*", "n"], AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
    want = {k: ATTRS[k] for k in ("app.trace", "n")}
    assert m2["MessageAttributes"] == want
    assert m2["MD5OfMessageAttributes"] == md5_of_attributes(want)
    assert m2["Attributes"] == {"ApproximateReceiveCount": "2"}
    # The old receipt handle may no longer change the lease; the new one deletes.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m2["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert code(e) == "ReceiptHandleIsInvalid"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="bad \x01 char")
    assert code(e) == "InvalidMessageContents"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x" * (1024 * 1024 + 1))
    assert code(e) == "InvalidParameterValue"
    r = sqs.send_message(QueueUrl=url, MessageBody="y" * (1024 * 1024))
    assert r["MD5OfMessageBody"] == hashlib.md5(b"y" * (1024 * 1024)).hexdigest()


def test_batches_partial_failures_and_batch_errors(sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    r = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "A", "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
            {"Id": "bad", "MessageBody": "bad \x02"},
            {"Id": "c", "MessageBody": "C", "DelaySeconds": 0},
        ],
    )
    assert sorted(e["Id"] for e in r["Successful"]) == ["a", "c"]
    assert [(f["Id"], f["SenderFault"]) for f in r["Failed"]] == [("bad", True)]
    ok = {e["Id"]: e for e in r["Successful"]}
    assert ok["a"]["MD5OfMessageBody"] == hashlib.md5(b"A").hexdigest()
    assert ok["a"]["MD5OfMessageAttributes"] == md5_of_attributes({"k": {"DataType": "String", "StringValue": "v"}})
    msgs = []
    for _ in range(10):
        msgs += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if len(msgs) >= 2:
            break
    assert sorted(m["Body"] for m in msgs) == ["A", "C"]
    entries = [{"Id": f"e{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)]
    r = sqs.change_message_visibility_batch(
        QueueUrl=url, Entries=[{**e, "VisibilityTimeout": 60} for e in entries] + [{"Id": "x", "ReceiptHandle": "junk", "VisibilityTimeout": 1}]
    )
    assert sorted(e["Id"] for e in r["Successful"]) == ["e0", "e1"]
    assert [f["Code"] for f in r["Failed"]] == ["ReceiptHandleIsInvalid"]
    r = sqs.delete_message_batch(QueueUrl=url, Entries=entries + [{"Id": "x", "ReceiptHandle": "junk"}])
    assert sorted(e["Id"] for e in r["Successful"]) == ["e0", "e1"]
    assert [f["Id"] for f in r["Failed"]] == ["x"]
    for entries, want in [
        ([], "AWS.SimpleQueueService.EmptyBatchRequest"),
        ([{"Id": f"i{i}", "MessageBody": "x"} for i in range(11)], "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
        ([{"Id": "d", "MessageBody": "x"}, {"Id": "d", "MessageBody": "y"}], "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
        ([{"Id": "bad id!", "MessageBody": "x"}], "AWS.SimpleQueueService.InvalidBatchEntryId"),
        ([{"Id": "big1", "MessageBody": "x" * 600_000}, {"Id": "big2", "MessageBody": "x" * 600_000}], "AWS.SimpleQueueService.BatchRequestTooLong"),
    ]:
        with pytest.raises(botocore.exceptions.ClientError) as e:
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert code(e) == want


def test_long_polling_wakes_on_send_and_defaults_to_the_queue_wait(sqs, name):
    url = sqs.create_queue(QueueName=name, Attributes={"ReceiveMessageWaitTimeSeconds": "2"})["QueueUrl"]
    t = time.time()
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    assert 1.5 < time.time() - t < 10, "the queue's ReceiveMessageWaitTimeSeconds applies"
    got = {}

    def poll():
        t0 = time.time()
        got["r"] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)
        got["t"] = time.time() - t0

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(1)
    sqs.send_message(QueueUrl=url, MessageBody="wake")
    th.join(30)
    assert got["r"]["Messages"][0]["Body"] == "wake"
    assert got["t"] < 8


def test_fifo_order_dedup_and_attributes(sqs, name):
    url = sqs.create_queue(QueueName=name + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    ids = []
    for i in range(5):
        r = sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g", MessageDeduplicationId=f"d{i}")
        ids.append(r["MessageId"])
        assert "SequenceNumber" in r
    dup = sqs.send_message(QueueUrl=url, MessageBody="m0 again", MessageGroupId="g", MessageDeduplicationId="d0")
    assert dup["MessageId"] == ids[0]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="no group")
    assert code(e) in ("MissingParameter", "InvalidParameterValue")
    seen = []
    for _ in range(10):
        r = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], ReceiveRequestAttemptId=f"a{len(seen)}"
        )
        for m in r.get("Messages", []):
            seen.append(m)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        if len(seen) >= 5:
            break
    assert [m["Body"] for m in seen] == [f"m{i}" for i in range(5)]
    seqs = [int(m["Attributes"]["SequenceNumber"]) for m in seen]
    assert seqs == sorted(seqs)
    assert {m["Attributes"]["MessageGroupId"] for m in seen} == {"g"}
    assert [m["Attributes"]["MessageDeduplicationId"] for m in seen] == [f"d{i}" for i in range(5)]
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert a["FifoQueue"] == "true"


def test_dead_letter_queue_move_and_sources(sqs, name):
    dlq = sqs.create_queue(QueueName=name + "-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    src = sqs.create_queue(
        QueueName=name,
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})},
    )["QueueUrl"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]
    sqs.send_message(QueueUrl=src, MessageBody="poison")
    m = sqs.receive_message(QueueUrl=src, VisibilityTimeout=0)["Messages"][0]
    assert m["Body"] == "poison"
    moved = None
    deadline = time.time() + 15
    while time.time() < deadline and not moved:
        assert "Messages" not in sqs.receive_message(QueueUrl=src, VisibilityTimeout=0) or True
        r = sqs.receive_message(QueueUrl=dlq, MessageSystemAttributeNames=["All"], WaitTimeSeconds=1)
        moved = r.get("Messages", [None])[0]
    assert moved and moved["Body"] == "poison"
    assert moved["Attributes"].get("DeadLetterQueueSourceArn") == f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"
    a = sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    assert a == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


def test_redrive_with_message_move_tasks(sqs, name):
    dlq = sqs.create_queue(QueueName=name + "-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    src = sqs.create_queue(
        QueueName=name,
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})},
    )["QueueUrl"]
    for i in range(5):
        sqs.send_message(QueueUrl=src, MessageBody=f"m{i}")
    deadline = time.time() + 15
    while time.time() < deadline:
        sqs.receive_message(QueueUrl=src, VisibilityTimeout=0, MaxNumberOfMessages=10)
        n = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
        if n["ApproximateNumberOfMessages"] == "5":
            break
    else:
        pytest.fail("messages did not reach the dead-letter queue")
    handle = sqs.start_message_move_task(SourceArn=dlq_arn, MaxNumberOfMessagesPerSecond=100)["TaskHandle"]
    assert handle
    deadline = time.time() + 15
    while time.time() < deadline:
        tasks = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)["Results"]
        assert len(tasks) == 1
        if tasks[0]["Status"] == "COMPLETED":
            break
        time.sleep(0.05)
    t = tasks[0]
    assert t["Status"] == "COMPLETED" and t["SourceArn"] == dlq_arn
    assert t["ApproximateNumberOfMessagesMoved"] == 5 and t["MaxNumberOfMessagesPerSecond"] == 100
    assert "TaskHandle" not in t and "DestinationArn" not in t
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.cancel_message_move_task(TaskHandle=handle)
    assert code(e) == "AWS.SimpleQueueService.UnsupportedOperation"
    bodies = set()
    while time.time() < deadline and len(bodies) < 5:
        for m in sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            bodies.add(m["Body"])
    assert bodies == {f"m{i}" for i in range(5)}


def test_unsupported_and_rejected_actions_say_so(sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
    assert code(e) == "AWS.SimpleQueueService.UnsupportedOperation"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.remove_permission(QueueUrl=url, Label="l")
    assert code(e) == "AWS.SimpleQueueService.UnsupportedOperation"
    # Move tasks: a queue that is nobody's DLQ cannot be a source; unknown handles are not found.
    arn = f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.start_message_move_task(SourceArn=arn)
    assert code(e) == "InvalidParameterValue"
    assert sqs.list_message_move_tasks(SourceArn=arn).get("Results", []) == []
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.list_message_move_tasks(SourceArn=arn + "-missing")
    assert code(e) == "ResourceNotFoundException"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.cancel_message_move_task(TaskHandle="x")
    assert code(e) == "ResourceNotFoundException"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.get_queue_attributes(QueueUrl=url.replace(name, "missing-" + name))
    assert code(e) == "AWS.SimpleQueueService.NonExistentQueue"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.send_message(QueueUrl="not a url", MessageBody="x")
    assert code(e) == "InvalidAddress"


def test_query_protocol_signed_forms_and_xml(query, endpoint, name):
    status, x = query.call("CreateQueue", {"QueueName": name, "Attribute.1.Name": "DelaySeconds", "Attribute.1.Value": "0", "Tag.1.Key": "k", "Tag.1.Value": "v"})
    assert status == 200, x
    url = x.find(f"{NS}CreateQueueResult/{NS}QueueUrl").text
    assert x.find(f"{NS}ResponseMetadata/{NS}RequestId").text
    body = "a\r\nb <c> & d"
    params = {
        "QueueUrl": url,
        "MessageBody": body,
        "MessageAttribute.1.Name": "bin",
        "MessageAttribute.1.Value.DataType": "Binary",
        "MessageAttribute.1.Value.BinaryValue": base64.b64encode(b"\x00\xfe").decode(),
        "MessageAttribute.2.Name": "str",
        "MessageAttribute.2.Value.DataType": "String",
        "MessageAttribute.2.Value.StringValue": "v",
    }
    status, x = query.call("SendMessage", params)
    assert status == 200
    r = x.find(f"{NS}SendMessageResult")
    assert r.find(f"{NS}MD5OfMessageBody").text == hashlib.md5(body.encode()).hexdigest()
    want = {"bin": {"DataType": "Binary", "BinaryValue": b"\x00\xfe"}, "str": {"DataType": "String", "StringValue": "v"}}
    assert r.find(f"{NS}MD5OfMessageAttributes").text == md5_of_attributes(want)
    # POST /<account>/<queue> without QueueUrl; the XML keeps the CR (escaped) for the MD5.
    path = "/" + url.split("/", 3)[3]
    status, x = query.call("ReceiveMessage", {"MessageAttributeName.1": "All", "AttributeName.1": "All"}, path=path)
    assert status == 200
    m = x.find(f"{NS}ReceiveMessageResult/{NS}Message")
    assert m.find(f"{NS}Body").text == body
    assert m.find(f"{NS}MD5OfBody").text == hashlib.md5(body.encode()).hexdigest()
    attrs = {a.find(f"{NS}Name").text: a.find(f"{NS}Value") for a in m.findall(f"{NS}MessageAttribute")}
    assert base64.b64decode(attrs["bin"].find(f"{NS}BinaryValue").text) == b"\x00\xfe"
    sysattrs = {a.find(f"{NS}Name").text: a.find(f"{NS}Value").text for a in m.findall(f"{NS}Attribute")}
    assert sysattrs["ApproximateReceiveCount"] == "1"
    status, x = query.call("DeleteMessage", {"QueueUrl": url, "ReceiptHandle": m.find(f"{NS}ReceiptHandle").text})
    assert status == 200 and x.tag == f"{NS}DeleteMessageResponse"
    status, x = query.call("ListQueueTags", {"QueueUrl": url})
    assert {t.find(f"{NS}Key").text: t.find(f"{NS}Value").text for t in x.iter(f"{NS}Tag")} == {"k": "v"}
    status, x = query.call("GetQueueAttributes", {"QueueUrl": url, "AttributeName.1": "All"})
    names = {a.find(f"{NS}Name").text for a in x.iter(f"{NS}Attribute")}
    assert {"QueueArn", "ApproximateNumberOfMessages", "VisibilityTimeout"} <= names
    # A presigned GET works; errors are XML ErrorResponses with the legacy code.
    status, x = query.call("ListQueues", {"QueueNamePrefix": name}, presign=True)
    assert status == 200, ET_text(x)
    assert [u.text for u in x.iter(f"{NS}QueueUrl")] == [url]
    status, x = query.call("GetQueueUrl", {"QueueName": "nope-" + name})
    assert status == 400
    assert x.find(f"{NS}Error/{NS}Code").text == "AWS.SimpleQueueService.NonExistentQueue"
    assert x.find(f"{NS}Error/{NS}Type").text == "Sender"
    status, x = query.call("Frobnicate")
    assert status == 400 and x.find(f"{NS}Error/{NS}Code").text == "InvalidAction"
    status, x = QueryClient(endpoint, secret="wrong").call("ListQueues")
    assert status == 403 and x.find(f"{NS}Error/{NS}Code").text == "SignatureDoesNotMatch"


def ET_text(x):
    import xml.etree.ElementTree as ET
    return ET.tostring(x)


def test_aws_cli(cli, name):
    url = json.loads(cli("create-queue", "--queue-name", name).stdout)["QueueUrl"]
    r = json.loads(cli("send-message", "--queue-url", url, "--message-body", "from the cli",
                       "--message-attributes", '{"k":{"DataType":"String","StringValue":"v"}}').stdout)
    assert r["MD5OfMessageBody"] == hashlib.md5(b"from the cli").hexdigest()
    r = json.loads(cli("receive-message", "--queue-url", url, "--message-attribute-names", "All").stdout)
    m = r["Messages"][0]
    assert m["Body"] == "from the cli" and m["MessageAttributes"]["k"]["StringValue"] == "v"
    cli("delete-message", "--queue-url", url, "--receipt-handle", m["ReceiptHandle"])
    a = json.loads(cli("get-queue-attributes", "--queue-url", url, "--attribute-names", "All").stdout)["Attributes"]
    assert a["ApproximateNumberOfMessages"] == "0"
    assert url in json.loads(cli("list-queues", "--queue-name-prefix", name).stdout)["QueueUrls"]
    p = cli("get-queue-url", "--queue-name", "nope-" + name, ok=False)
    assert p.returncode != 0 and "NonExistentQueue" in p.stderr
    cli("delete-queue", "--queue-url", url)
