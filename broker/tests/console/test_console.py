"""The web console in a real headless Chromium against a real sluiced: queues (create, send,
peek, receive, purge, redrive), topics, consumer groups, login with auth on, and the security
promises (cross-site POSTs refused, bodies shown as text, CSP). Each page's screenshot is
written to CONSOLE_SCREENSHOTS."""

import http.server
import json
import threading
import time

import pytest
from conftest import TENANT_A, TENANT_B, WAIT_S, shot
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait


def wait(driver, cond, timeout=WAIT_S):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(cond)


def find(driver, css, timeout=WAIT_S):
    return wait(driver, EC.visibility_of_element_located((By.CSS_SELECTOR, css)), timeout)


def text_of(driver, css):
    return driver.find_element(By.CSS_SELECTOR, css).text


def wait_text(driver, css, expected, timeout=WAIT_S):
    """Waits until the element's text contains `expected`."""
    def ok(d):
        try:
            return expected in d.find_element(By.CSS_SELECTOR, css).text
        except Exception:
            return False
    try:
        wait(driver, ok, timeout)
    except Exception:
        pytest.fail(f"{css} never showed {expected!r}; page: {driver.find_element(By.TAG_NAME, 'body').text[:2000]}")


def wait_exact(driver, css, expected, timeout=WAIT_S):
    """Waits until the element's text is exactly `expected`."""
    def ok(d):
        try:
            return d.find_element(By.CSS_SELECTOR, css).text == expected
        except Exception:
            return False
    try:
        wait(driver, ok, timeout)
    except Exception:
        pytest.fail(f"{css} never read {expected!r}; page: {driver.find_element(By.TAG_NAME, 'body').text[:2000]}")


def goto(driver, broker, route, host="127.0.0.1"):
    base = broker.url.replace("127.0.0.1", host)
    driver.get(base + "#/" + route)


def no_error_flash(driver):
    for e in driver.find_elements(By.CSS_SELECTOR, "#flash .error"):
        pytest.fail("the console showed an error: " + e.text)


def queue_url(broker, name, tenant=None):
    return broker.sqs(tenant).get_queue_url(QueueName=name)["QueueUrl"]


# ------------------------------------------------------------------------- overview


def test_overview_shows_health_readiness_disk_and_live_charts(open_broker, driver):
    sqs = open_broker.sqs()
    url = sqs.create_queue(QueueName="overview-load")["QueueUrl"]
    goto(driver, open_broker, "overview")
    wait_text(driver, "#card-ready", "ready")
    wait_text(driver, "#card-health", "ok")
    wait_text(driver, "#card-disk-full", "no")
    assert "2 / 2" in text_of(driver, "#card-shards")
    # Traffic while the page polls (a few seconds of it, for lines on the charts): the rate
    # chart's legend moves off zero.
    end = time.time() + WAIT_S
    busy_until = time.time() + 6
    seen = False
    while time.time() < end and not (seen and time.time() > busy_until):
        for i in range(20):
            sqs.send_message(QueueUrl=url, MessageBody=f"load {i}")
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        for m in got:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        legend = text_of(driver, "#chart-rates .legend")
        seen = seen or ("sent: 0.00" not in legend and "sent:" in legend)
        time.sleep(0.2)
    assert seen, "the send rate never rose on the chart"
    wait_text(driver, "#chart-latency .legend", "SendMessage")
    no_error_flash(driver)
    shot(driver, "overview")


# ------------------------------------------------------------------------- queues


def test_create_send_peek_receive_and_purge(open_broker, driver, name):
    goto(driver, open_broker, "queues")
    find(driver, "#new-queue-name").send_keys(name)
    driver.find_element(By.CSS_SELECTOR, "#create-queue-button").click()
    wait_text(driver, "#queues-table", name)
    # The search narrows the list.
    find(driver, "#queue-search").send_keys(name[:10])
    wait_text(driver, "#queue-count", "of")
    shot(driver, "queues")
    driver.find_element(By.LINK_TEXT, name).click()
    wait_text(driver, "#queue-name", name)

    # Send from the console; the counts show it.
    find(driver, "#send-body").send_keys("hello from the console")
    driver.find_element(By.CSS_SELECTOR, "#send-button").click()
    wait_text(driver, "#flash-msg", "Sent message")
    wait_exact(driver, "#count-visible .value", "1")

    # Peek twice: the message is shown, and nothing is leased or counted.
    for _ in range(2):
        driver.find_element(By.CSS_SELECTOR, "#peek-button").click()
        wait_text(driver, "#peek-table", "hello from the console")
    wait_exact(driver, "#count-visible .value", "1")
    assert text_of(driver, "#count-in-flight .value") == "0"
    shot(driver, "queue")

    # Receive and delete: the first receive, so its receive count is 1 after two peeks.
    driver.find_element(By.CSS_SELECTOR, "#receive-delete-button").click()
    wait_text(driver, "#received-table", "hello from the console")
    cells = driver.find_elements(By.CSS_SELECTOR, "#received-table tr.message td")
    assert cells[3].text == "1", [c.text for c in cells]
    wait_exact(driver, "#count-visible .value", "0")

    # Purge: messages sent by a client are gone.
    sqs = open_broker.sqs()
    url = queue_url(open_broker, name)
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"to purge {i}")
    wait_exact(driver, "#count-visible .value", "3")
    driver.find_element(By.CSS_SELECTOR, "#purge-button").click()
    wait(driver, EC.alert_is_present()).accept()
    wait_text(driver, "#flash-msg", "purged")
    wait_exact(driver, "#count-visible .value", "0")
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "0"
    no_error_flash(driver)


def test_peek_leaves_the_receive_count_unchanged(open_broker, driver, name):
    sqs = open_broker.sqs()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="peek me")
    goto(driver, open_broker, "queue/" + name)
    for _ in range(3):
        find(driver, "#peek-button").click()
        wait_text(driver, "#peek-table", "peek me")
    got = sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])["Messages"]
    assert len(got) == 1
    assert got[0]["Attributes"]["ApproximateReceiveCount"] == "1"


def test_attributes_are_editable(open_broker, driver, name):
    sqs = open_broker.sqs()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    goto(driver, open_broker, "queue/" + name)
    box = find(driver, "input[data-attr=VisibilityTimeout]")
    box.clear()
    box.send_keys("45")
    driver.find_element(By.CSS_SELECTOR, "#save-attributes").click()
    wait_text(driver, "#flash-msg", "Attributes saved")
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"


def test_a_script_body_shows_as_text(open_broker, driver, name):
    sqs = open_broker.sqs()
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    body = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold</b>'
    sqs.send_message(QueueUrl=url, MessageBody=body)
    goto(driver, open_broker, "queue/" + name)
    find(driver, "#peek-button").click()
    wait_text(driver, "#peek-table", "<script>")
    cell = driver.find_element(By.CSS_SELECTOR, "#peek-table td.body pre")
    assert cell.text == body
    # Nothing of the body became an element, and no script of it ran.
    assert driver.find_elements(By.CSS_SELECTOR, "#peek-table b, #peek-table img, #peek-table script") == []
    assert driver.execute_script("return window.__pwned === undefined")
    find(driver, "#receive-delete-button").click()
    wait_text(driver, "#received-table", "<script>")
    assert driver.find_elements(By.CSS_SELECTOR, "#received-table b, #received-table img, #received-table script") == []
    assert driver.execute_script("return window.__pwned === undefined")


def fill_dlq(sqs, name, n):
    """A queue `name` whose n messages all went to its dead-letter queue `name-dlq`."""
    dlq = sqs.create_queue(QueueName=name + "-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    src = sqs.create_queue(QueueName=name, Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"}),
    })["QueueUrl"]
    for i in range(0, n, 10):
        sqs.send_message_batch(QueueUrl=src, Entries=[
            {"Id": str(j), "MessageBody": f"poison {j}"} for j in range(i, min(n, i + 10))])
    # Each message is received once and let go; the next receive moves it to the DLQ.
    end = time.time() + WAIT_S
    while time.time() < end:
        sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10, VisibilityTimeout=0)
        a = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
        if a["Attributes"]["ApproximateNumberOfMessages"] == str(n):
            return src, dlq
        time.sleep(0.05)
    pytest.fail("the messages never reached the dead-letter queue")


def test_redrive_from_the_dlq_runs_to_completion(open_broker, driver, name):
    sqs = open_broker.sqs()
    n = 5
    src, _ = fill_dlq(sqs, name, n)

    goto(driver, open_broker, "queue/" + name + "-dlq")
    wait_text(driver, "#dlq", name)
    find(driver, "#redrive-start").click()
    wait_text(driver, "#flash-msg", "Redrive started")
    wait_text(driver, "#tasks-table", "COMPLETED")
    wait_text(driver, "#tasks-table", f"{n} of {n} moved")
    wait_exact(driver, "#count-visible .value", "0")
    shot(driver, "queue-redrive")
    a = sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["ApproximateNumberOfMessages"])
    assert a["Attributes"]["ApproximateNumberOfMessages"] == str(n)
    no_error_flash(driver)


def test_a_redrive_can_be_cancelled(open_broker, driver, name):
    sqs = open_broker.sqs()
    n = 30
    src, dlq = fill_dlq(sqs, name, n)
    goto(driver, open_broker, "queue/" + name + "-dlq")
    wait_text(driver, "#dlq", name)
    # One message a second: the task is still running when it is cancelled.
    find(driver, "#redrive-rate").send_keys("1")
    driver.find_element(By.CSS_SELECTOR, "#redrive-start").click()
    wait_text(driver, "#tasks-table", "RUNNING")
    find(driver, "#tasks-table tr.move-task button").click()
    wait_text(driver, "#tasks-table", "CANCELLED")
    moved = int(sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["ApproximateNumberOfMessages"])
                ["Attributes"]["ApproximateNumberOfMessages"])
    assert moved < n, moved
    no_error_flash(driver)


# ------------------------------------------------------------------------- topics and groups


def kafka(broker, **extra):
    return dict(bootstrap_servers=f"127.0.0.1:{broker.kafka_port}", **extra)


@pytest.fixture(scope="module")
def topic(open_broker):
    """A topic of 2 partitions: 5 text records with keys and headers, and a binary one, in
    partition 0."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    name = "console-topic"
    admin = KafkaAdminClient(**kafka(open_broker))
    admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])
    admin.close()
    prod = KafkaProducer(**kafka(open_broker, acks="all"))
    for i in range(5):
        prod.send(name, partition=0, key=f"key-{i}".encode(), value=f"<i>record {i}</i>".encode(),
                  headers=[("trace", f"t{i}".encode())])
    prod.send(name, partition=0, key=b"bin", value=bytes([0, 1, 2, 0xfe, 0xff]))
    prod.flush()
    prod.close()
    return name


def test_browse_a_topic(open_broker, driver, topic):
    goto(driver, open_broker, "topics")
    wait_text(driver, "#topics-table", topic)
    assert "0: 0–6" in text_of(driver, f"tr[data-topic={topic}]")
    shot(driver, "topics")
    driver.find_element(By.LINK_TEXT, topic).click()
    wait_text(driver, "#topic-name", topic)
    find(driver, "#browse-offset").send_keys("2")
    driver.find_element(By.CSS_SELECTOR, "#browse-button").click()
    wait_text(driver, "#records-table", "record 4")
    rows = driver.find_elements(By.CSS_SELECTOR, "#records-table tr.record")
    assert [r.find_element(By.CSS_SELECTOR, "td").text for r in rows] == ["2", "3", "4", "5"]
    assert "key-2" in rows[0].text and "trace" in rows[0].text and "t2" in rows[0].text
    # Text is escaped (no <i> element); binary is hex.
    assert driver.find_elements(By.CSS_SELECTOR, "#records-table i") == []
    assert "<i>record 2</i>" in rows[0].text
    assert "hex" in rows[3].text and "000102feff" in rows[3].text
    shot(driver, "topic")
    # From a time: the first record at or after it (all of them, for a time before the first).
    driver.find_element(By.CSS_SELECTOR, "#browse-offset").clear()
    driver.execute_script("document.getElementById('browse-time').value = '2000-01-01T00:00:00'")
    driver.find_element(By.CSS_SELECTOR, "#browse-button").click()
    wait_text(driver, "#records", "From offset 0")


def test_see_a_groups_lag(open_broker, driver, topic):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    group = "console-group"
    c = KafkaConsumer(**kafka(open_broker, group_id=group, enable_auto_commit=False))
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    try:
        om = OffsetAndMetadata(2, "", -1)
    except TypeError:
        om = OffsetAndMetadata(2, "")
    c.commit({tp: om})
    c.close()
    goto(driver, open_broker, "groups")
    wait_text(driver, "#groups-table", group)
    assert text_of(driver, f"tr[data-group={group}] .group-lag") == "4"
    shot(driver, "groups")
    driver.find_element(By.LINK_TEXT, group).click()
    wait_text(driver, "#lag-table", topic)
    row = driver.find_element(By.CSS_SELECTOR, "#lag-table tr.lag-row")
    assert [td.text for td in row.find_elements(By.CSS_SELECTOR, "td")] == [topic, "0", "2", "6", "4"]
    wait_text(driver, "#chart-lag .legend", f"{topic}[0]: 4")
    shot(driver, "group")


def test_account_page(open_broker, driver):
    goto(driver, open_broker, "account")
    wait_text(driver, "#account-id", "000000000000")
    wait_text(driver, "#account-table", "off: every caller is this account")
    shot(driver, "account")


# ------------------------------------------------------------------------- security


def session(broker):
    """A console session as a browser gets it: (cookie header, CSRF token)."""
    status, headers, body = broker.request("/console/api/session")
    assert status == 200, body
    cookie = headers["Set-Cookie"].split(";")[0]
    return cookie, body["csrf"]


def test_every_response_has_the_csp_and_the_cookie_is_strict(open_broker):
    status, headers, _ = open_broker.request("/console/")
    assert status == 200
    csp = headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    _, headers, _ = open_broker.request("/console/api/session")
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie
    # Over TLS (an https page behind a proxy) the cookie is Secure too.
    _, headers, _ = open_broker.request("/console/api/session", headers={"Origin": "https://127.0.0.1"})
    assert "Secure" in headers["Set-Cookie"]


def test_changes_need_the_csrf_token_and_the_same_origin(open_broker, name):
    cookie, csrf = session(open_broker)
    origin = open_broker.console_base()
    ok = {"Cookie": cookie, "Content-Type": "application/json", "X-Sluice-Csrf": csrf, "Origin": origin}
    refused = [
        {k: v for k, v in ok.items() if k != "X-Sluice-Csrf"},
        dict(ok, **{"X-Sluice-Csrf": "0" * 64}),
        dict(ok, Origin="http://evil.example"),
        dict(ok, Origin="http://localhost:1"),
        dict(ok, **{"Content-Type": "text/plain"}),
        {k: v for k, v in ok.items() if k != "Cookie"},
    ]
    for h in refused:
        status, _, body = open_broker.request("/console/api/sqs/CreateQueue", "POST", {"QueueName": name}, h)
        assert status in (401, 403), (h, status, body)
    with pytest.raises(Exception):
        queue_url(open_broker, name)
    status, _, body = open_broker.request("/console/api/sqs/CreateQueue", "POST", {"QueueName": name}, ok)
    assert status == 200 and "QueueUrl" in body, body
    # With auth off, the HTTP API's Host check: a DNS-rebinding name is refused.
    status, _, _ = open_broker.request("/console/api/session", headers={"Host": "evil.example"})
    assert status == 403


EVIL_PAGE = """<!doctype html><html><body>
<form id="f" method="POST" enctype="text/plain" action="{target}/console/api/sqs/CreateQueue">
<input name='{{"QueueName":"{queue}","x":"' value='"}}'></form>
<script>
fetch("{target}/console/api/sqs/CreateQueue", {{method: "POST", mode: "no-cors", credentials: "include",
  headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{QueueName: "{queue}-fetch"}})}})
  .finally(() => document.getElementById("f").submit());
</script></body></html>"""


def test_a_forged_cross_site_post_is_refused(open_broker, driver, name):
    # The victim has a console session open (its cookie is in the browser).
    goto(driver, open_broker, "queues")
    find(driver, "#queues-table")
    page = EVIL_PAGE.format(target=open_broker.console_base(), queue=name).encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    # Another site: a different loopback address, so a different origin and site.
    server = http.server.HTTPServer(("127.0.0.2", 0), Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        driver.get(f"http://127.0.0.2:{server.server_address[1]}/")
        # The form navigates to the console's answer: a refusal.
        wait(driver, lambda d: "/console/api/" in d.current_url)
        assert "error" in driver.find_element(By.TAG_NAME, "body").text
        time.sleep(0.5)
    finally:
        server.shutdown()
    listed = open_broker.sqs().list_queues(QueueNamePrefix=name).get("QueueUrls", [])
    assert listed == [], listed


def test_login_with_auth_on_sees_only_its_own_queues(auth_broker, driver, name):
    a, b = auth_broker.sqs(TENANT_A), auth_broker.sqs(TENANT_B)
    a.create_queue(QueueName=name + "-a")
    b.create_queue(QueueName=name + "-b")
    # The auth-on broker is reached as localhost: its cookie is not the open broker's.
    goto(driver, auth_broker, "queues", host="localhost")
    find(driver, "#login-form")
    shot(driver, "login")
    find(driver, "#login-key").send_keys(TENANT_A[0])
    driver.find_element(By.CSS_SELECTOR, "#login-secret").send_keys("wrong")
    driver.find_element(By.CSS_SELECTOR, "#login-button").click()
    wait_text(driver, "#flash-msg", "wrong")
    driver.find_element(By.CSS_SELECTOR, "#login-secret").clear()
    driver.find_element(By.CSS_SELECTOR, "#login-secret").send_keys(TENANT_A[1])
    driver.find_element(By.CSS_SELECTOR, "#login-button").click()
    wait_text(driver, "#queues-table", name + "-a")
    assert name + "-b" not in text_of(driver, "#queues-table")
    assert TENANT_A[2] in text_of(driver, "#who")
    # Another account's queue is not found by name either, as in the SQS API.
    goto(driver, auth_broker, "queue/" + name + "-b", host="localhost")
    wait_text(driver, "#flash-msg", "QueueDoesNotExist")
    goto(driver, auth_broker, "account", host="localhost")
    wait_text(driver, "#account-id", TENANT_A[2])
    shot(driver, "account-auth")
    # Log out: the session is gone.
    driver.find_element(By.CSS_SELECTOR, "#logout").click()
    find(driver, "#login-form")
    status, _, _ = auth_broker.request("/console/api/queues")
    assert status == 401


def test_failed_logins_are_rate_limited(auth_broker):
    origin = {"Content-Type": "application/json"}
    statuses = []
    for _ in range(8):
        s, _, _ = auth_broker.request("/console/api/login", "POST",
                                      {"access_key_id": TENANT_B[0], "secret": "guess"}, origin)
        statuses.append(s)
    # At most 5 failures per address per minute (the browser test's wrong secret may count).
    assert 429 in statuses, statuses
    first = statuses.index(429)
    assert 1 <= first <= 5 and statuses[:first] == [401] * first, statuses
    assert statuses[first:] == [429] * (len(statuses) - first), statuses
    # The right secret is refused too while the address is throttled (no oracle).
    s, _, _ = auth_broker.request("/console/api/login", "POST",
                                  {"access_key_id": TENANT_B[0], "secret": TENANT_B[1]}, origin)
    assert s == 429
