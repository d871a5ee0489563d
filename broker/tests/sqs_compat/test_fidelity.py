"""SQS fidelity: requests Amazon SQS refuses are refused here too, with the error code AWS's
SDKs expect (one test per behaviour that once differed)."""

import http.client
import json
import urllib.parse

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.exceptions
import botocore.httpsession
import pytest

from conftest import ACCESS_KEY, ACCOUNT, REGION, SECRET_KEY, QueryClient


def code(exc):
    return exc.value.response["Error"]["Code"]


def arn(name):
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


def policy(target):
    return {"RedrivePolicy": json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": 3})}


def test_redrive_targets_must_exist_differ_and_match_the_type(sqs, name):
    sqs.create_queue(QueueName=name + "-std")
    sqs.create_queue(QueueName=name + "-f.fifo", Attributes={"FifoQueue": "true"})
    for qname, attrs, target in [
        (name, {}, arn(name + "-missing")),
        (name, {}, arn(name)),  # itself
        (name, {}, arn(name + "-f.fifo")),  # standard -> FIFO
        (name + "-g.fifo", {"FifoQueue": "true"}, arn(name + "-std")),  # FIFO -> standard
    ]:
        with pytest.raises(botocore.exceptions.ClientError) as e:
            sqs.create_queue(QueueName=qname, Attributes={**attrs, **policy(target)})
        assert code(e) == "InvalidAttributeValue", (target, e.value.response)
        assert "RedrivePolicy" in str(e.value)
    urls = sqs.list_queues(QueueNamePrefix=name).get("QueueUrls", [])
    assert sorted(u.rsplit("/", 1)[1] for u in urls) == sorted([name + "-std", name + "-f.fifo"])
    # SetQueueAttributes checks the same; a valid target still works.
    src = sqs.create_queue(QueueName=name)["QueueUrl"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=src, Attributes=policy(arn(name + "-missing")))
    assert code(e) == "InvalidAttributeValue"
    sqs.set_queue_attributes(QueueUrl=src, Attributes=policy(arn(name + "-std")))


def test_a_fifo_name_needs_fifo_queue_true(sqs, name):
    for attrs in [{}, {"FifoQueue": "false"}]:
        with pytest.raises(botocore.exceptions.ClientError) as e:
            sqs.create_queue(QueueName=name + ".fifo", Attributes=attrs)
        assert code(e) in ("InvalidParameterValue", "InvalidAttributeValue"), e.value.response
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=name)
    url = sqs.create_queue(QueueName=name + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["FifoQueue"])["Attributes"]
    assert a["FifoQueue"] == "true"


def test_number_attributes_keep_sqs_precision_and_range(sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    for good in ["1e125", "-9.99e125", "1e-128", "0", "12345678901234567890123456789012345678"]:
        sqs.send_message(
            QueueUrl=url, MessageBody="x",
            MessageAttributes={"n": {"DataType": "Number", "StringValue": good}},
        )
    for bad in ["1e500", "1e126", "1e-129", "123456789012345678901234567890123456789"]:
        with pytest.raises(botocore.exceptions.ClientError) as e:
            sqs.send_message(
                QueueUrl=url, MessageBody="x",
                MessageAttributes={"n": {"DataType": "Number", "StringValue": bad}},
            )
        assert code(e) == "InvalidParameterValue", (bad, e.value.response)


def test_the_query_protocol_refuses_invalid_utf8(endpoint, name):
    q = QueryClient(endpoint)
    status, xml = q.call("ListQueues", {"QueueNamePrefix": b"ok\xff"})
    assert status == 400
    assert xml.find(".//{*}Code").text == "MalformedQueryString"
    status, _ = q.call("ListQueues", {"QueueNamePrefix": "é"})
    assert status == 200


def _raw_json(endpoint, target, body=b"{}"):
    creds = botocore.credentials.Credentials(ACCESS_KEY, SECRET_KEY)
    req = botocore.awsrequest.AWSRequest(
        method="POST",
        url=endpoint + "/",
        data=body,
        headers={"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.0"},
    )
    botocore.auth.SigV4Auth(creds, "sqs", REGION).add_auth(req)
    return botocore.httpsession.URLLib3Session().send(req.prepare())


def test_an_unknown_target_is_unknown_operation_exception(endpoint):
    for target in ["AmazonSQS.NoSuchAction", "Bogus", "AmazonSQS."]:
        r = _raw_json(endpoint, target)
        assert r.status_code == 400, r.content
        err = json.loads(r.content)
        assert err["__type"].endswith("UnknownOperationException"), err
        assert target in err["message"], err


def test_an_oversized_body_is_blamed_on_the_request_not_a_parameter(endpoint):
    host = urllib.parse.urlparse(endpoint).netloc
    for target, status, expected in [
        ("AmazonSQS.GetQueueAttributes", 413, "RequestEntityTooLarge"),
        ("AmazonSQS.SendMessage", 400, "InvalidParameterValue"),
    ]:
        # Signed headers (the signature's form, key and date are checked before any body is
        # read); the body itself never comes: the size is judged on Content-Length.
        creds = botocore.credentials.Credentials(ACCESS_KEY, SECRET_KEY)
        req = botocore.awsrequest.AWSRequest(
            method="POST",
            url=endpoint + "/",
            data=b"",
            headers={"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.0"},
        )
        botocore.auth.SigV4Auth(creds, "sqs", REGION).add_auth(req)
        c = http.client.HTTPConnection(host, timeout=10)
        c.putrequest("POST", "/", skip_host=True, skip_accept_encoding=True)
        for k, v in req.prepare().headers.items():
            if k.lower() != "content-length":
                c.putheader(k, v)
        c.putheader("Content-Length", str(3 * 1024 * 1024))
        c.endheaders()
        r = c.getresponse()
        data = r.read()
        c.close()
        assert r.status == status, (target, data)
        assert r.getheader("x-amzn-query-error", "").startswith(expected), (target, r.getheaders())
        if expected == "InvalidParameterValue":
            assert b"MessageBody" in data
        else:
            assert b"MessageBody" not in data
