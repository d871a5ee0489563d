"""The SQS audit of issue 27: behaviours that differed from Amazon SQS (error codes, JSON
`__type`, HTTP status, message wording) and now match it, one test each. Where AWS's answer is
quoted, it is the answer AWS gives (recorded against AWS by other SQS implementations' test
suites, and in AWS's documentation)."""

import json
import time

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.exceptions
import botocore.httpsession
import pytest

from conftest import ACCESS_KEY, ACCOUNT, REGION, SECRET_KEY


def err(exc):
    return exc.value.response["Error"]


def status(exc):
    return exc.value.response["ResponseMetadata"]["HTTPStatusCode"]


def raw_json(endpoint, action, params):
    """One signed AWS JSON 1.0 request; returns (status, x-amzn-query-error, parsed body)."""
    creds = botocore.credentials.Credentials(ACCESS_KEY, SECRET_KEY)
    req = botocore.awsrequest.AWSRequest(
        method="POST",
        url=endpoint + "/",
        data=json.dumps(params).encode(),
        headers={"X-Amz-Target": "AmazonSQS." + action, "Content-Type": "application/x-amz-json-1.0"},
    )
    botocore.auth.SigV4Auth(creds, "sqs", REGION).add_auth(req)
    r = botocore.httpsession.URLLib3Session().send(req.prepare())
    return r.status_code, r.headers.get("x-amzn-query-error"), json.loads(r.content or b"{}")


def test_json_errors_carry_the_exception_shape_names_sqs_uses(endpoint, sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    st, qerr, body = raw_json(endpoint, "ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 11})
    assert st == 400
    assert qerr == "InvalidParameterValue;Sender"
    assert body["__type"] == "com.amazonaws.sqs#InvalidParameterValueException", body
    st, qerr, body = raw_json(endpoint, "SendMessage", {"QueueUrl": url})
    assert st == 400
    assert qerr == "MissingParameter;Sender"
    assert body["__type"] == "com.amazonaws.sqs#MissingRequiredParameterException", body
    assert body["message"] == "The request must contain the parameter MessageBody."


def test_a_missing_queue_is_worded_as_each_protocol_words_it(endpoint, query, name):
    url = f"{endpoint}/{ACCOUNT}/{name}"
    st, qerr, body = raw_json(endpoint, "GetQueueAttributes", {"QueueUrl": url})
    assert (st, qerr) == (400, "AWS.SimpleQueueService.NonExistentQueue;Sender")
    assert body == {
        "__type": "com.amazonaws.sqs#QueueDoesNotExist",
        "message": "The specified queue does not exist.",
    }
    st, xml = query.call("GetQueueAttributes", {"QueueUrl": url})
    assert st == 400
    assert xml.find(".//{*}Code").text == "AWS.SimpleQueueService.NonExistentQueue"
    assert xml.find(".//{*}Message").text == "The specified queue does not exist for this wsdl version."


@pytest.mark.parametrize(
    "param,value,reason",
    [
        ("MaxNumberOfMessages", 0, "Must be between 1 and 10, if provided."),
        ("MaxNumberOfMessages", 11, "Must be between 1 and 10, if provided."),
        ("WaitTimeSeconds", 21, "Must be >= 0 and <= 20, if provided."),
        ("WaitTimeSeconds", -1, "Must be >= 0 and <= 20, if provided."),
        ("VisibilityTimeout", 43201, "Must be between 0 and 43200, if provided."),
    ],
)
def test_receive_parameters_out_of_range_name_the_value(sqs, name, param, value, reason):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.receive_message(QueueUrl=url, **{param: value})
    assert err(e)["Code"] == "InvalidParameterValue"
    assert err(e)["Message"] == f"Value {value} for parameter {param} is invalid. Reason: {reason}"


def test_a_fifo_send_without_a_group_id_is_refused_as_sqs_refuses_it(sqs, name):
    url = sqs.create_queue(
        QueueName=name + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    # SendMessage: a missing parameter.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x")
    assert err(e)["Code"] == "MissingParameter"
    assert err(e)["Message"] == "The request must contain the parameter MessageGroupId."
    # SendMessageBatch: the whole request fails (not the entry), and nothing is sent.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": "a", "MessageBody": "x", "MessageGroupId": "g"}, {"Id": "b", "MessageBody": "y"}],
        )
    assert err(e)["Code"] == "InvalidParameterValue"
    assert err(e)["Message"] == "The request must contain the parameter MessageGroupId."
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    # Without content-based deduplication, an entry without a deduplication id fails the batch.
    plain = sqs.create_queue(QueueName=name + "-p.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.send_message_batch(QueueUrl=plain, Entries=[{"Id": "a", "MessageBody": "x", "MessageGroupId": "g"}])
    assert err(e)["Code"] == "InvalidParameterValue"
    assert "ContentBasedDeduplication" in err(e)["Message"]


def test_fifo_queue_attribute_on_set_queue_attributes(sqs, name):
    std = sqs.create_queue(QueueName=name)["QueueUrl"]
    fifo = sqs.create_queue(QueueName=name + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    # A standard queue has no such attribute.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=std, Attributes={"FifoQueue": "true"})
    assert err(e)["Code"] == "InvalidAttributeName"
    # A FIFO queue accepts its own value (tools that write back every attribute do this)...
    sqs.set_queue_attributes(QueueUrl=fifo, Attributes={"FifoQueue": "true", "VisibilityTimeout": "7"})
    got = sqs.get_queue_attributes(QueueUrl=fifo, AttributeNames=["All"])["Attributes"]
    assert (got["FifoQueue"], got["VisibilityTimeout"]) == ("true", "7")
    # ...and refuses a change of type.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.set_queue_attributes(QueueUrl=fifo, Attributes={"FifoQueue": "false"})
    assert err(e)["Code"] == "InvalidAttributeValue"


def test_stale_receipt_handles_are_invalid_values_and_garbage_is_an_invalid_handle(sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1, WaitTimeSeconds=5)["Messages"][0]
    time.sleep(1.5)
    second = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30, WaitTimeSeconds=5)["Messages"][0]
    stale = "Reason: Message does not exist or is not available for visibility timeout change."
    # An older receive's handle cannot move the current lease.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=5)
    assert err(e)["Code"] == "InvalidParameterValue"
    assert err(e)["Message"] == f"Value {first['ReceiptHandle']} for parameter ReceiptHandle is invalid. {stale}"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    # A deleted message's handle: the same, alone and in a batch.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=5)
    assert err(e)["Code"] == "InvalidParameterValue"
    r = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "gone", "ReceiptHandle": second["ReceiptHandle"], "VisibilityTimeout": 5},
            {"Id": "junk", "ReceiptHandle": "not-a-handle", "VisibilityTimeout": 5},
        ],
    )
    failed = {f["Id"]: f for f in r["Failed"]}
    assert failed["gone"]["Code"] == "InvalidParameterValue" and stale in failed["gone"]["Message"]
    assert failed["junk"]["Code"] == "ReceiptHandleIsInvalid"
    # Something that is no handle at all stays ReceiptHandleIsInvalid (404 in the model).
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle="not-a-handle", VisibilityTimeout=5)
    assert err(e)["Code"] == "ReceiptHandleIsInvalid"
    assert status(e) == 404


def test_a_fifo_delete_with_an_expired_handle_says_it_expired(sqs, name):
    url = sqs.create_queue(
        QueueName=name + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m", MessageGroupId="g")
    h = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1, WaitTimeSeconds=5)["Messages"][0]["ReceiptHandle"]
    time.sleep(1.5)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=h)
    assert err(e)["Code"] == "InvalidParameterValue"
    assert err(e)["Message"] == f"Value {h} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
    # The message was not deleted: it is delivered again.
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert again[0]["Body"] == "m"


def test_a_move_task_on_a_missing_queue_is_not_found_with_404(sqs, name):
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.start_message_move_task(SourceArn=f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}")
    assert err(e)["Code"] == "ResourceNotFoundException"
    assert status(e) == 404
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.list_message_move_tasks(SourceArn=f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}")
    assert status(e) == 404


def test_batch_request_errors_are_worded_as_sqs_words_them(endpoint, sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    cases = [
        ([], "AWS.SimpleQueueService.EmptyBatchRequest",
         "There should be at least one SendMessageBatchRequestEntry in the request."),
        ([{"Id": f"i{i}", "MessageBody": "x"} for i in range(11)],
         "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
         "Maximum number of entries per request are 10. You have sent 11."),
        ([{"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}],
         "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", "Id a repeated."),
        ([{"Id": "a:b", "MessageBody": "x"}], "AWS.SimpleQueueService.InvalidBatchEntryId",
         "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
         "It can be at most 80 letters long."),
        ([{"Id": f"i{i}", "MessageBody": "x" * 200_000} for i in range(6)],
         "AWS.SimpleQueueService.BatchRequestTooLong",
         "Batch requests cannot be longer than 1048576 bytes. You have sent 1200000 bytes."),
    ]
    for entries, code, message in cases:
        st, qerr, body = raw_json(endpoint, "SendMessageBatch", {"QueueUrl": url, "Entries": entries})
        assert (st, qerr) == (400, code + ";Sender"), body
        assert body["message"] == message
    st, _, body = raw_json(endpoint, "DeleteMessageBatch", {"QueueUrl": url, "Entries": []})
    assert body["message"] == "There should be at least one DeleteMessageBatchRequestEntry in the request."


def test_a_second_purge_within_60_seconds_names_the_queue(sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.purge_queue(QueueUrl=url)
    assert err(e)["Code"] == "AWS.SimpleQueueService.PurgeQueueInProgress"
    assert status(e) == 403
    assert err(e)["Message"] == f"Only one PurgeQueue operation on {name} is allowed every 60 seconds."


def test_an_empty_message_body_is_a_missing_parameter(sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="")
    assert err(e)["Code"] == "MissingParameter"
    assert err(e)["Message"] == "The request must contain the parameter MessageBody."
    r = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "e", "MessageBody": ""}, {"Id": "ok", "MessageBody": "x"}])
    assert [f["Code"] for f in r["Failed"]] == ["MissingParameter"]
    assert [s["Id"] for s in r["Successful"]] == ["ok"]


def test_move_task_arns_that_are_not_arns_are_invalid_values(sqs):
    for call in [
        lambda: sqs.start_message_move_task(SourceArn="not-an-arn"),
        lambda: sqs.list_message_move_tasks(SourceArn="arn:aws:sqs"),
    ]:
        with pytest.raises(botocore.exceptions.ClientError) as e:
            call()
        assert err(e)["Code"] == "InvalidParameterValue"
        assert err(e)["Message"].startswith("You must use this format to specify the SourceArn: arn:")


def test_an_unknown_queue_attribute_is_named_as_sqs_names_it(sqs, name):
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    for attrs, bad in [({"Bogus": "1"}, "Bogus"), ({"ContentBasedDeduplication": "true"}, "ContentBasedDeduplication")]:
        with pytest.raises(botocore.exceptions.ClientError) as e:
            sqs.set_queue_attributes(QueueUrl=url, Attributes=attrs)
        assert err(e)["Code"] == "InvalidAttributeName"
        assert err(e)["Message"] == f"Unknown Attribute {bad}."
