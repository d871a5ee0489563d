"""Bad input over real TCP: every malformed or unknown request gets Kafka's error code in an
answer with its correlation id, and the broker (and, where Kafka allows, the connection) keeps
serving. Also the idempotent producer's retry rule, byte for byte."""

import socket
import struct

from conftest import Raw, create_topic, parse_produce_v3, produce_v3, record_batch, string

UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
MESSAGE_TOO_LARGE = 10
CORRUPT_MESSAGE = 2
UNSUPPORTED_COMPRESSION_TYPE = 76
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
SASL_AUTHENTICATION_FAILED = 58


def api_versions_ok(raw):
    corr, body = raw.request(18, 0, b"")
    assert corr == raw.corr
    assert struct.unpack(">h", body[:2])[0] == 0
    (n,) = struct.unpack(">i", body[2:6])
    keys = {struct.unpack(">h", body[6 + 6 * i:8 + 6 * i])[0] for i in range(n)}
    assert {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18, 19, 20, 22, 32, 36} <= keys
    return keys


def test_unknown_apis_and_versions_get_unsupported_version_and_the_connection_goes_on(broker):
    raw = Raw(broker)
    corr, body = raw.request(999, 0, b"")
    assert corr == raw.corr and struct.unpack(">h", body[:2])[0] == UNSUPPORTED_VERSION
    keys = api_versions_ok(raw)
    assert 23 not in keys  # OffsetForLeaderEpoch: not served...
    corr, body = raw.request(23, 2, b"")  # ...so answered, not dropped
    assert struct.unpack(">h", body[:2])[0] == UNSUPPORTED_VERSION
    corr, body = raw.request(3, 99, b"")  # Metadata v99
    assert struct.unpack(">h", body[:2])[0] == UNSUPPORTED_VERSION
    # ApiVersions at an unknown version: error 35 and the versions, in v0's layout.
    corr, body = raw.request(18, 99, b"")
    assert struct.unpack(">h", body[:2])[0] == UNSUPPORTED_VERSION
    assert struct.unpack(">i", body[2:6])[0] >= 17
    api_versions_ok(raw)
    raw.close()
    assert broker.alive()


def test_a_malformed_body_gets_invalid_request_and_the_connection_goes_on(broker):
    raw = Raw(broker)
    # FindCoordinator v1 whose key claims 30000 bytes that are not there.
    corr, body = raw.request(10, 1, struct.pack(">h", 30000) + b"abc")
    assert corr == raw.corr
    throttle, code = struct.unpack(">ih", body[:6])
    assert code == INVALID_REQUEST
    # Metadata v1 with a topic array of 2^31-1 entries and no bytes after.
    corr, body = raw.request(3, 1, struct.pack(">i", 2**31 - 1))
    assert corr == raw.corr
    api_versions_ok(raw)
    raw.close()
    assert broker.alive()


def test_an_oversized_request_is_answered_message_too_large_then_closed(broker):
    raw = Raw(broker)
    raw.sock.sendall(struct.pack(">i", 64 * 1024 * 1024) + struct.pack(">hhi", 18, 0, 77))
    resp = raw.recv_frame()
    assert resp is not None
    corr, code = struct.unpack(">ih", resp[:6])
    assert (corr, code) == (77, MESSAGE_TOO_LARGE)
    assert raw.recv_frame() is None, "closed after the answer"
    raw.close()
    raw = Raw(broker)
    api_versions_ok(raw)
    raw.close()


def test_frames_too_short_or_negative_close_only_their_connection(broker):
    for size in (struct.pack(">i", 3) + b"abc", struct.pack(">i", -5)):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        s.sendall(size)
        try:
            closed = s.recv(16) == b""
        except ConnectionResetError:  # closed with our bytes unread
            closed = True
        assert closed
        s.close()
    raw = Raw(broker)
    api_versions_ok(raw)
    raw.close()
    assert broker.alive()


def test_unauthenticated_requests_and_wrong_passwords_are_refused(broker):
    raw = Raw(broker, authenticate=False)
    api_versions_ok(raw)  # allowed before SASL: clients ask it first
    corr, body = raw.request(3, 1, struct.pack(">i", 0))
    assert corr == raw.corr
    assert raw.recv_frame() is None, "closed after the refusal"
    raw.close()
    raw = Raw(broker, authenticate=False)
    assert raw.sasl_plain("AKIDKAFKACOMPAT", "not-the-secret") == SASL_AUTHENTICATION_FAILED
    raw.close()


def test_corrupt_and_compressed_batches_get_their_codes(broker, topic):
    create_topic(broker, topic, 1)
    raw = Raw(broker)
    good = bytearray(record_batch([b"x", b"y"]))
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    _, body = raw.request(0, 3, produce_v3(topic, 0, bad_crc))
    assert parse_produce_v3(body)[0][1] == CORRUPT_MESSAGE
    gz = bytearray(good)
    gz[22] |= 1  # attributes, low byte: gzip (the CRC covers them: corrupt)
    _, body = raw.request(0, 3, produce_v3(topic, 0, gz))
    assert parse_produce_v3(body)[0][1] == CORRUPT_MESSAGE
    codec5 = bytearray(good)
    codec5[22] |= 5  # a codec Kafka does not have
    _, body = raw.request(0, 3, produce_v3(topic, 0, codec5))
    assert parse_produce_v3(body)[0][1] == UNSUPPORTED_COMPRESSION_TYPE
    _, body = raw.request(0, 3, produce_v3(topic, 0, good[:30]))
    assert parse_produce_v3(body)[0][1] == CORRUPT_MESSAGE
    _, body = raw.request(0, 3, produce_v3(topic, 0, good))
    assert parse_produce_v3(body)[0][1:] == (0, 0), "nothing bad was stored before it"
    raw.close()


def test_an_idempotent_retry_is_stored_once_and_a_gap_is_refused(broker, topic):
    create_topic(broker, topic, 1)
    raw = Raw(broker)
    pid = 4242
    first = record_batch([b"a", b"b"], producer_id=pid, epoch=0, base_sequence=0)
    _, body = raw.request(0, 3, produce_v3(topic, 0, first))
    assert parse_produce_v3(body) == [(0, 0, 0)]
    # The same batch again (a retry after a lost answer): the first offsets, nothing stored.
    _, body = raw.request(0, 3, produce_v3(topic, 0, first))
    assert parse_produce_v3(body) == [(0, 0, 0)]
    gap = record_batch([b"z"], producer_id=pid, epoch=0, base_sequence=5)
    _, body = raw.request(0, 3, produce_v3(topic, 0, gap))
    assert parse_produce_v3(body)[0][1] == OUT_OF_ORDER_SEQUENCE_NUMBER
    nxt = record_batch([b"c"], producer_id=pid, epoch=0, base_sequence=2)
    _, body = raw.request(0, 3, produce_v3(topic, 0, nxt))
    assert parse_produce_v3(body) == [(0, 0, 2)], "stored right after the first batch"
    raw.close()
