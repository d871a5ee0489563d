"""Tenant isolation and SigV4 as an attacker tries them over HTTP, against the real sluiced:
tenant A holds a valid key of account 111111111111 and aims at account 222222222222 (tenant B)
through every action; captured signed requests are replayed with other bodies; presigned URLs
are sent with bodies of the attacker's choosing."""

import hashlib
import json
import time
import uuid

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.exceptions
import pytest
import urllib3

from conftest import REGION, TENANT_A, TENANT_B, QueryClient

NOT_FOUND = {
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
    "ResourceNotFoundException",
}
HTTP = urllib3.PoolManager()


def code(exc):
    return exc.value.response["Error"]["Code"]


def arn(account, name):
    return f"arn:aws:sqs:{REGION}:{account}:{name}"


def refused(call, codes=NOT_FOUND):
    with pytest.raises(botocore.exceptions.ClientError) as e:
        call()
    assert code(e) in codes, e.value.response


def test_an_account_reaches_nothing_of_another_over_http(sqs_a, sqs_b, endpoint, name):
    b = TENANT_B[2]
    # The victim: a tagged queue with messages (one of them leased), a DLQ with a source and
    # a running move task out of it.
    victim = sqs_b.create_queue(QueueName=name, tags={"team": "victim"})["QueueUrl"]
    for i in range(3):
        sqs_b.send_message(QueueUrl=victim, MessageBody=f"secret {i}")
    stolen = sqs_b.receive_message(QueueUrl=victim, WaitTimeSeconds=1)["Messages"][0]["ReceiptHandle"]
    dlq = sqs_b.create_queue(QueueName=name + "-dlq")["QueueUrl"]
    src = sqs_b.create_queue(
        QueueName=name + "-src",
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn(b, name + "-dlq"), "maxReceiveCount": 1})},
    )["QueueUrl"]
    for i in range(5):
        sqs_b.send_message(QueueUrl=src, MessageBody=f"dead {i}")
    deadline = time.time() + 15
    while time.time() < deadline:
        sqs_b.receive_message(QueueUrl=src, VisibilityTimeout=0, MaxNumberOfMessages=10)
        n = sqs_b.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
        if n["Attributes"]["ApproximateNumberOfMessages"] == "5":
            break
    else:
        pytest.fail("the victim's DLQ did not fill")
    task = sqs_b.start_message_move_task(SourceArn=arn(b, name + "-dlq"), MaxNumberOfMessagesPerSecond=1)["TaskHandle"]

    own = sqs_a.create_queue(QueueName=name)["QueueUrl"]
    sqs_a.send_message(QueueUrl=own, MessageBody="mine")

    for url in [victim, f"/{b}/{name}", f"https://sqs.{REGION}.amazonaws.com/{b}/{name}"]:
        attempts = {
            "DeleteQueue": lambda: sqs_a.delete_queue(QueueUrl=url),
            "GetQueueAttributes": lambda: sqs_a.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]),
            "SetQueueAttributes": lambda: sqs_a.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "0"}),
            "PurgeQueue": lambda: sqs_a.purge_queue(QueueUrl=url),
            "TagQueue": lambda: sqs_a.tag_queue(QueueUrl=url, Tags={"team": "attacker"}),
            "UntagQueue": lambda: sqs_a.untag_queue(QueueUrl=url, TagKeys=["team"]),
            "ListQueueTags": lambda: sqs_a.list_queue_tags(QueueUrl=url),
            "ListDeadLetterSourceQueues": lambda: sqs_a.list_dead_letter_source_queues(QueueUrl=url),
            "SendMessage": lambda: sqs_a.send_message(QueueUrl=url, MessageBody="injected"),
            "SendMessageBatch": lambda: sqs_a.send_message_batch(
                QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "injected"}]
            ),
            "ReceiveMessage": lambda: sqs_a.receive_message(QueueUrl=url, MaxNumberOfMessages=10),
            "DeleteMessage": lambda: sqs_a.delete_message(QueueUrl=url, ReceiptHandle=stolen),
            "DeleteMessageBatch": lambda: sqs_a.delete_message_batch(
                QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": stolen}]
            ),
            "ChangeMessageVisibility": lambda: sqs_a.change_message_visibility(
                QueueUrl=url, ReceiptHandle=stolen, VisibilityTimeout=0
            ),
            "ChangeMessageVisibilityBatch": lambda: sqs_a.change_message_visibility_batch(
                QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": stolen, "VisibilityTimeout": 0}]
            ),
        }
        for action, call in attempts.items():
            with pytest.raises(botocore.exceptions.ClientError) as e:
                call()
            assert code(e) in NOT_FOUND, (action, url, e.value.response)

    # The Query protocol's path form names the victim's queue in the URL path.
    status, _ = QueryClient(endpoint, secret=TENANT_A[1], access_key=TENANT_A[0]).call(
        "SendMessage", {"MessageBody": "injected"}, path=f"/{b}/{name}"
    )
    assert status == 400
    refused(lambda: sqs_a.get_queue_url(QueueName=name + "-dlq", QueueOwnerAWSAccountId=b))
    assert all(b not in u for u in sqs_a.list_queues().get("QueueUrls", []))
    # Stolen receipt handles do nothing on the attacker's own queue either.
    codes = {"ReceiptHandleIsInvalid"}
    refused(lambda: sqs_a.delete_message(QueueUrl=own, ReceiptHandle=stolen), codes)
    refused(lambda: sqs_a.change_message_visibility(QueueUrl=own, ReceiptHandle=stolen, VisibilityTimeout=0), codes)
    # Move tasks and ARNs of the victim.
    refused(lambda: sqs_a.start_message_move_task(SourceArn=arn(b, name + "-dlq")))
    refused(lambda: sqs_a.list_message_move_tasks(SourceArn=arn(b, name + "-dlq")))
    refused(lambda: sqs_a.cancel_message_move_task(TaskHandle=task))
    # A redrive into the victim's queue, at creation and later.
    policy = {"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn(b, name), "maxReceiveCount": 1})}
    refused(lambda: sqs_a.create_queue(QueueName=name + "-evil", Attributes=policy), {"InvalidAttributeValue"})
    refused(lambda: sqs_a.set_queue_attributes(QueueUrl=own, Attributes=policy), {"InvalidAttributeValue"})

    # The victim's world is as it was.
    a = sqs_b.get_queue_attributes(QueueUrl=victim, AttributeNames=["All"])["Attributes"]
    assert a["ApproximateNumberOfMessages"] == "2" and a["ApproximateNumberOfMessagesNotVisible"] == "1"
    assert a["VisibilityTimeout"] == "30"
    assert sqs_b.list_queue_tags(QueueUrl=victim)["Tags"] == {"team": "victim"}
    assert sqs_b.list_dead_letter_source_queues(QueueUrl=victim).get("queueUrls", []) == []
    assert sqs_b.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]
    sqs_b.delete_message(QueueUrl=victim, ReceiptHandle=stolen)  # still the victim's live lease
    tasks = sqs_b.list_message_move_tasks(SourceArn=arn(b, name + "-dlq"), MaxResults=10)["Results"]
    assert len(tasks) == 1 and tasks[0]["Status"] in ("RUNNING", "COMPLETED"), tasks
    got = sqs_a.receive_message(QueueUrl=own, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in got] == ["mine"]


def _signed(endpoint, body, headers, tenant=TENANT_A):
    """A POST signed by `tenant` (header form), prepared: what an eavesdropper could capture."""
    creds = botocore.credentials.Credentials(tenant[0], tenant[1])
    req = botocore.awsrequest.AWSRequest(method="POST", url=endpoint + "/", data=body, headers=headers)
    botocore.auth.SigV4Auth(creds, "sqs", REGION).add_auth(req)
    return req.prepare()


def _send(method, url, headers, body):
    headers = {k: v for k, v in headers.items() if k.lower() != "content-length"}
    return HTTP.request(method, url, body=body, headers=headers, retries=False)


def _refused_signature(r):
    assert r.status == 403, (r.status, r.data)
    assert r.headers.get("x-amzn-query-error", "").startswith("SignatureDoesNotMatch") or b"SignatureDoesNotMatch" in r.data, r.data


def test_a_captured_signature_does_not_carry_another_body(sqs_a, endpoint, name):
    q = sqs_a.create_queue(QueueName=name)["QueueUrl"]
    # JSON: a SendMessage signed with the body's hash in x-amz-content-sha256 (as SDKs that
    # send the header sign it), replayed with another message.
    body = json.dumps({"QueueUrl": q, "MessageBody": "hello"}).encode()
    headers = {
        "X-Amz-Target": "AmazonSQS.SendMessage",
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest(),
    }
    captured = _signed(endpoint, body, headers)
    r = _send("POST", captured.url, dict(captured.headers), captured.body)
    assert r.status == 200, r.data
    evil = json.dumps({"QueueUrl": q, "MessageBody": "evil"}).encode()
    _refused_signature(_send("POST", captured.url, dict(captured.headers), evil))
    # The header recomputed for the new body does not help: it is signed.
    h = dict(captured.headers)
    h["X-Amz-Content-SHA256"] = hashlib.sha256(evil).hexdigest()
    _refused_signature(_send("POST", captured.url, h, evil))
    got = sqs_a.receive_message(QueueUrl=q, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in got] == ["hello"]

    # Query: a captured ListQueues becomes no CreateQueue (Action lives in the body).
    listing = b"Action=ListQueues&Version=2012-11-05"
    form = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    captured = _signed(endpoint, listing, {**form, "X-Amz-Content-SHA256": hashlib.sha256(listing).hexdigest()})
    assert _send("POST", captured.url, dict(captured.headers), captured.body).status == 200
    pwned = f"pwned-{uuid.uuid4().hex[:12]}"
    create = f"Action=CreateQueue&QueueName={pwned}&Version=2012-11-05".encode()
    _refused_signature(_send("POST", captured.url, dict(captured.headers), create))
    # Without the header the server hashes the body itself: the same replay fails too.
    captured = _signed(endpoint, listing, form)
    _refused_signature(_send("POST", captured.url, dict(captured.headers), create))
    assert all(pwned not in u for u in sqs_a.list_queues().get("QueueUrls", []))


def test_presigned_urls_take_nothing_from_the_body(sqs_a, endpoint, name):
    q = sqs_a.create_queue(QueueName=name)["QueueUrl"]
    creds = botocore.credentials.Credentials(TENANT_A[0], TENANT_A[1])
    params = {"Action": "GetQueueAttributes", "QueueUrl": q, "AttributeName.1": "All", "Version": "2012-11-05"}
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    delete = f"Action=DeleteQueue&QueueUrl={q}".encode()
    for signer in (botocore.auth.SigV4QueryAuth, botocore.auth.S3SigV4QueryAuth):
        # S3's signer signs UNSIGNED-PAYLOAD, botocore's SQS signer the empty body's hash.
        req = botocore.awsrequest.AWSRequest(method="POST", url=endpoint + "/", params=dict(params))
        signer(creds, "sqs", REGION, expires=60).add_auth(req)
        url = req.prepare().url
        ok = _send("POST", url, {}, b"")
        assert ok.status == 200 and b"QueueArn" in ok.data, (signer.__name__, ok.data)
        _refused_signature(_send("POST", url, form, delete))
        assert sqs_a.get_queue_attributes(QueueUrl=q, AttributeNames=["QueueArn"])["Attributes"]
