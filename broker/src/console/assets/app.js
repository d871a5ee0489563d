// The Sluice console: a single page that calls /console/api/. Every node is built with
// createElement and textContent: nothing from the broker (bodies, attributes, names) is ever
// parsed as HTML.
"use strict";

const state = { csrf: "", account: "", auth: false, timers: [] };

// ---------------------------------------------------------------- DOM helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "className") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function view(...children) {
  const v = document.getElementById("view");
  v.replaceChildren(...children.flat());
}

function flash(text, error) {
  const f = document.getElementById("flash");
  f.replaceChildren(el("div", { className: error ? "error" : "", id: "flash-msg" }, text));
  setTimeout(() => { if (f.firstChild && f.firstChild.textContent === text) f.replaceChildren(); }, 6000);
}

function every(ms, fn) {
  fn();
  state.timers.push(setInterval(fn, ms));
}

function table(headers, rows, id) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}

function fmtAge(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function fmtTime(ms) {
  return ms ? new Date(Number(ms)).toISOString() : "–";
}

// A key, header or body as the API shows it: text (shown as text) or hex (labelled).
function shown(v) {
  if (!v) return el("span", { className: "note" }, "(none)");
  const cut = v.cut ? el("span", { className: "note" }, ` … (${v.bytes} bytes, cut)`) : null;
  if (v.hex !== undefined) {
    return el("span", {}, el("span", { className: "tag" }, "hex"), el("pre", { className: "value" }, v.hex), cut);
  }
  return el("span", {}, el("pre", { className: "value" }, v.text), cut);
}

// ---------------------------------------------------------------- API

class ApiError extends Error {}

async function api(path, body) {
  const opts = { credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    opts.method = "POST";
    opts.headers["Content-Type"] = "application/json";
    opts.headers["X-Sluice-Csrf"] = state.csrf;
    opts.body = JSON.stringify(body);
  }
  const r = await fetch("/console/api/" + path, opts);
  let data = {};
  try { data = await r.json(); } catch (e) { data = { error: r.statusText }; }
  if (r.status === 401 && path !== "login") { showLogin(); throw new ApiError("log in first"); }
  if (!r.ok) throw new ApiError(data.error || r.statusText);
  return data;
}

// One SQS action as the session's account; an SQS error is thrown with its code.
async function sqs(action, params) {
  const r = await api("sqs/" + action, params || {});
  if (r && r.error) throw new ApiError(`${r.code}: ${r.error}`);
  return r || {};
}

function q(params) {
  return new URLSearchParams(params).toString();
}

async function guarded(fn) {
  try { await fn(); } catch (e) { flash(e.message, true); }
}

// ---------------------------------------------------------------- charts

// A line chart drawn on a canvas: series of [time_ms, value] points.
function chart(id, title, series) {
  const canvas = el("canvas", { id: id + "-canvas", width: 760, height: 320 });
  const legend = el("div", { className: "legend" });
  const box = el("div", { className: "chart", id }, el("div", { className: "title" }, title), legend, canvas);
  const colors = ["#1f6feb", "#2e7d32", "#c62828", "#8e24aa", "#ef6c00"];
  const data = series.map(() => []);
  const maxPoints = 120;
  function draw() {
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 44;
    ctx.clearRect(0, 0, w, h);
    ctx.font = "20px system-ui, sans-serif";
    let max = 0;
    for (const d of data) for (const p of d) max = Math.max(max, p[1]);
    if (max <= 0) max = 1;
    const all = data.flat();
    const t0 = all.length ? Math.min(...all.map((p) => p[0])) : 0;
    const t1 = all.length ? Math.max(...all.map((p) => p[0])) : 1;
    ctx.strokeStyle = "#d8dee6"; ctx.fillStyle = "#5b6b7c"; ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = h - pad + ((pad * 2 - h) * i) / 4;
      ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 8, y); ctx.stroke();
      const v = (max * i) / 4;
      ctx.fillText(v >= 100 ? v.toFixed(0) : v.toFixed(v >= 10 ? 1 : 2), 2, y + 6);
    }
    data.forEach((d, i) => {
      ctx.strokeStyle = colors[i % colors.length]; ctx.lineWidth = 3;
      ctx.beginPath();
      d.forEach((p, j) => {
        const x = pad + ((w - pad - 8) * (p[0] - t0)) / Math.max(1, t1 - t0);
        const y = h - pad - ((h - pad * 2) * p[1]) / max;
        if (j === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      });
      ctx.stroke();
    });
    ctx.fillStyle = "#5b6b7c";
    ctx.fillText(`last ${Math.round((t1 - t0) / 1000)} s`, w - 140, h - 8);
  }
  function push(t, values) {
    values.forEach((v, i) => {
      data[i].push([t, v]);
      if (data[i].length > maxPoints) data[i].shift();
    });
    legend.replaceChildren(...series.map((s, i) => {
      const last = data[i].length ? data[i][data[i].length - 1][1] : 0;
      const sw = el("span", {}, "■ ", `${s}: ${Number(last).toFixed(last >= 100 ? 0 : 2)}`);
      sw.style.color = colors[i % colors.length];
      return sw;
    }));
    draw();
  }
  draw();
  return { box, push };
}

// ---------------------------------------------------------------- pages

async function pageOverview() {
  const cards = el("div", { className: "cards", id: "overview-cards" });
  const rates = chart("chart-rates", "Messages per second", ["sent", "received", "deleted"]);
  const latency = chart("chart-latency", "Request latency (ms, mean over the interval)", ["SendMessage", "ReceiveMessage", "DeleteMessage"]);
  const age = chart("chart-age", "Oldest message age (s): how long the oldest message has waited to be received", ["oldest"]);
  view(el("h1", {}, "Overview"), cards, el("div", { className: "charts" }, rates.box, latency.box, age.box),
    el("p", { className: "note" }, "Rates and latencies are the broker's own counters (the same as /metrics), read every second while this page is open."));
  let last = null;
  every(1000, () => guarded(async () => {
    const o = await api("overview");
    const card = (label, value, cls, id) => el("div", { className: "card", id }, el("div", { className: "label" }, label), el("div", { className: "value " + (cls || "") }, value));
    cards.replaceChildren(...[
      card("Health", o.health, "ok", "card-health"),
      card("Ready", o.ready ? "ready" : "not ready", o.ready ? "ok" : "bad", "card-ready"),
      o.ready ? null : card("Why not ready", o.not_ready_reason, "bad", "card-why"),
      card("Shards", `${o.shards_answered} / ${o.shards}`, o.shards_answered === o.shards ? "ok" : "bad", "card-shards"),
      card("Disk free", fmtBytes(o.disk_free_bytes), o.disk_full ? "bad" : "", "card-disk"),
      card("Disk full", o.disk_full ? `yes (reserve ${fmtBytes(o.disk_reserve_bytes)})` : "no", o.disk_full ? "bad" : "ok", "card-disk-full"),
      card("Oldest message", fmtAge(o.oldest_message_age_ms), "", "card-oldest"),
      card("Uptime", fmtAge(Math.round(o.uptime_s * 1000)), "", "card-uptime")].filter(Boolean));
    if (last) {
      const dt = Math.max(0.001, (o.now_ms - last.now_ms) / 1000);
      const d = (k) => Math.max(0, o.totals[k] - last.totals[k]) / dt;
      rates.push(o.now_ms, [d("sent"), d("received"), d("deleted")]);
      const lat = (k) => {
        const a = o.request_latency[k], b = last.request_latency[k];
        if (!a) return 0;
        const n = a.count - (b ? b.count : 0);
        return n > 0 ? (a.us_sum - (b ? b.us_sum : 0)) / n / 1000 : 0;
      };
      latency.push(o.now_ms, [lat("SendMessage"), lat("ReceiveMessage"), lat("DeleteMessage")]);
    }
    age.push(o.now_ms, [(o.oldest_message_age_ms || 0) / 1000]);
    last = o;
  }));
}

async function pageQueues() {
  const search = el("input", { id: "queue-search", placeholder: "search queues", type: "search" });
  const body = el("tbody", {});
  const count = el("span", { className: "note", id: "queue-count" });
  const name = el("input", { id: "new-queue-name", placeholder: "new queue name" });
  const create = el("form", { id: "create-queue", onsubmit: (ev) => {
    ev.preventDefault();
    guarded(async () => {
      const attrs = name.value.endsWith(".fifo") ? { FifoQueue: "true" } : {};
      await sqs("CreateQueue", { QueueName: name.value, Attributes: attrs });
      flash(`Queue ${name.value} created`);
      name.value = "";
      await load();
    });
  } }, name, el("button", { type: "submit", id: "create-queue-button" }, "Create queue"));
  async function load() {
    const r = await api("queues?" + q({ search: search.value }));
    count.textContent = `${r.queues.length} of ${r.total} queues`;
    body.replaceChildren(...r.queues.map((x) => el("tr", { "data-queue": x.name },
      el("td", {}, el("a", { href: "#/queue/" + encodeURIComponent(x.name) }, x.name), x.fifo ? el("span", { className: "tag" }, "FIFO") : null),
      el("td", { className: "num" }, x.visible),
      el("td", { className: "num" }, x.in_flight),
      el("td", { className: "num" }, x.delayed),
      el("td", { className: "num" }, fmtAge(x.oldest_age_ms)),
      el("td", { className: "num" }, x.partitions))));
  }
  search.addEventListener("input", () => guarded(load));
  view(el("h1", {}, "Queues"), create, el("div", { className: "row" }, search, count),
    el("table", { id: "queues-table" }, el("thead", {}, el("tr", {}, ["Queue", "Visible", "In flight", "Delayed", "Oldest message", "Partitions"].map((h) => el("th", {}, h)))), body));
  every(2000, () => guarded(load));
}

// The attributes a person may change (the rest are shown read-only).
const EDITABLE = ["VisibilityTimeout", "DelaySeconds", "MaximumMessageSize", "MessageRetentionPeriod",
  "ReceiveMessageWaitTimeSeconds", "RedrivePolicy", "RedriveAllowPolicy", "ContentBasedDeduplication",
  "DeduplicationScope", "FifoThroughputLimit", "Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "SqsManagedSseEnabled"];

async function pageQueue(name) {
  const { QueueUrl: url } = await sqs("GetQueueUrl", { QueueName: name });
  const attrsBox = el("div", { id: "queue-attributes" });
  const counts = el("div", { className: "cards", id: "queue-counts" });
  const peekBox = el("div", { id: "peek-results" });
  const receivedBox = el("div", { id: "received-results" });
  const dlqBox = el("div", { id: "dlq" });
  const tasksBox = el("div", { id: "move-tasks" });
  let arn = "";
  let attrs = {};

  async function loadAttrs(redraw) {
    const r = await sqs("GetQueueAttributes", { QueueUrl: url, AttributeNames: ["All"] });
    attrs = r.Attributes || {};
    arn = attrs.QueueArn || "";
    const card = (label, value, id) => el("div", { className: "card", id }, el("div", { className: "label" }, label), el("div", { className: "value" }, value));
    counts.replaceChildren(
      card("Visible", attrs.ApproximateNumberOfMessages, "count-visible"),
      card("In flight", attrs.ApproximateNumberOfMessagesNotVisible, "count-in-flight"),
      card("Delayed", attrs.ApproximateNumberOfMessagesDelayed, "count-delayed"));
    if (!redraw) return;
    const inputs = {};
    // The counts are the live cards above; the table holds the queue's settings.
    const rows = Object.keys(attrs).filter((k) => !k.startsWith("ApproximateNumber")).sort().map((k) => {
      let cell;
      if (EDITABLE.includes(k)) {
        inputs[k] = el("input", { name: k, value: attrs[k], size: 48, "data-attr": k });
        cell = inputs[k];
      } else {
        cell = attrs[k];
      }
      return el("tr", {}, el("td", {}, k), el("td", {}, cell));
    });
    const save = el("button", { id: "save-attributes", onclick: () => guarded(async () => {
      const changed = {};
      for (const [k, i] of Object.entries(inputs)) if (i.value !== attrs[k]) changed[k] = i.value;
      if (!Object.keys(changed).length) { flash("Nothing changed"); return; }
      await sqs("SetQueueAttributes", { QueueUrl: url, Attributes: changed });
      flash("Attributes saved: " + Object.keys(changed).join(", "));
      await loadAttrs(true);
    }) }, "Save attributes");
    attrsBox.replaceChildren(table(["Attribute", "Value"], rows, "attributes-table"), el("div", { className: "row" }, save));
  }

  const body = el("textarea", { id: "send-body", placeholder: "message body" });
  const group = el("input", { id: "send-group", placeholder: "MessageGroupId (FIFO)" });
  const send = el("form", { id: "send-form", onsubmit: (ev) => {
    ev.preventDefault();
    guarded(async () => {
      const p = { QueueUrl: url, MessageBody: body.value };
      if (name.endsWith(".fifo")) {
        p.MessageGroupId = group.value || "console";
        p.MessageDeduplicationId = String(Date.now()) + Math.random().toString(16).slice(2);
      }
      const r = await sqs("SendMessage", p);
      flash("Sent message " + r.MessageId);
      await loadAttrs(false);
    });
  } }, body, name.endsWith(".fifo") ? group : null, el("button", { type: "submit", id: "send-button" }, "Send test message"));

  function messagesTable(list, withReceive, id) {
    return table(["Partition / offset", "Message id", "Sent", withReceive ? "Receive count" : "Key (group)", "Body"],
      list.map((m) => el("tr", { className: "message" },
        el("td", {}, m.partition === undefined ? "–" : `${m.partition} / ${m.offset}`),
        el("td", {}, m.id),
        el("td", {}, fmtTime(m.sent)),
        el("td", {}, withReceive ? m.receives : shown(m.key)),
        el("td", { className: "body" }, shown(m.body)))), id);
  }

  const peek = el("button", { className: "plain", id: "peek-button", onclick: () => guarded(async () => {
    const r = await api("peek?" + q({ queue: name, max: 20 }));
    const list = r.messages.map((m) => {
      const h = (m.headers || []).find((x) => x.key.text === "message-id");
      return { partition: m.partition, offset: m.offset, id: h ? h.value.text : "", sent: m.timestamp_ms, key: m.key, body: m.value };
    });
    peekBox.replaceChildren(el("p", { className: "note" }, `${list.length} message(s) in the queue's log, read as a stream: no lease taken, no receive counted. Messages already deleted stay in the log until it is compacted.`),
      messagesTable(list, false, "peek-table"));
  }) }, "Peek (no receive)");

  const receive = el("button", { className: "danger", id: "receive-delete-button", onclick: () => guarded(async () => {
    const r = await sqs("ReceiveMessage", { QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 0, MessageSystemAttributeNames: ["All"] });
    const msgs = r.Messages || [];
    for (const m of msgs) await sqs("DeleteMessage", { QueueUrl: url, ReceiptHandle: m.ReceiptHandle });
    const list = msgs.map((m) => ({ id: m.MessageId, sent: (m.Attributes || {}).SentTimestamp, receives: (m.Attributes || {}).ApproximateReceiveCount, body: { text: m.Body } }));
    receivedBox.replaceChildren(el("p", { className: "note" }, `Received and deleted ${list.length} message(s).`), messagesTable(list, true, "received-table"));
    await loadAttrs(false);
  }) }, "Receive and delete (consumes messages)");

  const purge = el("button", { className: "danger", id: "purge-button", onclick: () => guarded(async () => {
    if (!window.confirm(`Purge ${name}? Every message in it is deleted.`)) return;
    await sqs("PurgeQueue", { QueueUrl: url });
    flash(`Queue ${name} purged`);
    await loadAttrs(false);
  }) }, "Purge queue");

  const del = el("button", { className: "danger", id: "delete-queue-button", onclick: () => guarded(async () => {
    if (!window.confirm(`Delete the queue ${name} and its messages?`)) return;
    await sqs("DeleteQueue", { QueueUrl: url });
    flash(`Queue ${name} deleted`);
    location.hash = "#/queues";
  }) }, "Delete queue");

  async function loadDlq() {
    const parts = [];
    const policy = attrs.RedrivePolicy ? JSON.parse(attrs.RedrivePolicy) : null;
    if (policy) {
      const dlqName = String(policy.deadLetterTargetArn || "").split(":").pop();
      parts.push(el("p", {}, "Dead-letter queue: ", el("a", { href: "#/queue/" + encodeURIComponent(dlqName), id: "dlq-link" }, dlqName), ` after ${policy.maxReceiveCount} receives.`));
    }
    const sources = await sqs("ListDeadLetterSourceQueues", { QueueUrl: url });
    const urls = sources.queueUrls || [];
    if (urls.length) {
      parts.push(el("p", {}, "This is the dead-letter queue of: ", urls.map((u) => {
        const n = u.split("/").pop();
        return el("a", { href: "#/queue/" + encodeURIComponent(n), className: "source" }, n + " ");
      })));
    }
    if (!parts.length) parts.push(el("p", { className: "note" }, "No redrive policy, and no queue sends its dead letters here."));
    dlqBox.replaceChildren(...parts);
  }

  const dest = el("input", { id: "redrive-destination", placeholder: "destination ARN (default: the source queues)", size: 48 });
  const rate = el("input", { id: "redrive-rate", placeholder: "messages/s (optional)", size: 18 });
  const start = el("button", { id: "redrive-start", onclick: () => guarded(async () => {
    const p = { SourceArn: arn };
    if (dest.value) p.DestinationArn = dest.value;
    if (rate.value) p.MaxNumberOfMessagesPerSecond = Number(rate.value);
    const r = await sqs("StartMessageMoveTask", p);
    flash("Redrive started: " + r.TaskHandle);
    await loadTasks();
  }) }, "Start redrive");

  async function loadTasks() {
    if (!arn) return;
    const r = await sqs("ListMessageMoveTasks", { SourceArn: arn, MaxResults: 10 });
    const rows = (r.Results || []).map((t) => {
      const total = t.ApproximateNumberOfMessagesToMove;
      const moved = t.ApproximateNumberOfMessagesMoved || 0;
      const pct = total ? Math.min(100, (100 * moved) / total) : (t.Status === "COMPLETED" ? 100 : 0);
      const bar = el("div", {}); bar.style.width = pct.toFixed(0) + "%";
      const cancel = t.Status === "RUNNING" && t.TaskHandle ? el("button", { className: "plain", onclick: () => guarded(async () => {
        await sqs("CancelMessageMoveTask", { TaskHandle: t.TaskHandle });
        flash("Cancelling the redrive");
        await loadTasks();
      }) }, "Cancel") : null;
      return el("tr", { className: "move-task", "data-status": t.Status },
        el("td", { className: "task-status" }, t.Status),
        el("td", {}, el("span", { className: "progress" }, bar), ` ${moved} of ${total === undefined ? "?" : total} moved`),
        el("td", {}, t.DestinationArn || "(source queues)"),
        el("td", {}, fmtTime(t.StartedTimestamp)),
        el("td", {}, t.FailureReason || ""),
        el("td", {}, cancel));
    });
    tasksBox.replaceChildren(rows.length ? table(["Status", "Progress", "Destination", "Started", "Failure", ""], rows, "tasks-table") : el("p", { className: "note" }, "No redrive tasks."));
  }

  view(el("h1", {}, "Queue ", el("span", { id: "queue-name" }, name)), el("p", { className: "note" }, url), counts,
    el("h2", {}, "Send a test message"), send,
    el("h2", {}, "Messages"), el("div", { className: "row" }, peek, receive, purge, del), peekBox, receivedBox,
    el("h2", {}, "Dead letters and redrive"), dlqBox,
    el("div", { className: "row" }, dest, rate, start), tasksBox,
    el("h2", {}, "Attributes"), attrsBox);
  await loadAttrs(true);
  await loadDlq();
  every(1000, () => guarded(async () => { await loadAttrs(false); await loadTasks(); }));
}

async function pageTopics() {
  const r = await api("topics");
  const rows = r.topics.map((t) => el("tr", { "data-topic": t.name },
    el("td", {}, el("a", { href: "#/topic/" + encodeURIComponent(t.name) }, t.name)),
    el("td", { className: "num" }, t.partitions.length),
    el("td", {}, t.partitions.map((p) => `${p.partition}: ${p.start}–${p.end}`).join(", ")),
    el("td", {}, t.retention_ms ? fmtAge(t.retention_ms) : "forever"),
    el("td", {}, t.retention_bytes ? fmtBytes(t.retention_bytes) : "unbounded")));
  view(el("h1", {}, "Topics"), rows.length ? table(["Topic", "Partitions", "Offsets (start–end)", "Retention time", "Retention size"], rows, "topics-table") : el("p", { className: "note" }, "No topics in this account."));
}

async function pageTopic(name) {
  const r = await api("topics");
  const t = r.topics.find((x) => x.name === name);
  if (!t) { view(el("h1", {}, "No topic " + name)); return; }
  const part = el("select", { id: "browse-partition" }, t.partitions.map((p) => el("option", { value: p.partition }, `partition ${p.partition} (${p.start}–${p.end})`)));
  const offset = el("input", { id: "browse-offset", placeholder: "offset (default: earliest)", size: 20 });
  const time = el("input", { id: "browse-time", type: "datetime-local", step: 1 });
  const results = el("div", { id: "records" });
  const browse = el("form", { id: "browse-form", onsubmit: (ev) => {
    ev.preventDefault();
    guarded(async () => {
      const params = { topic: name, partition: part.value, max: 50 };
      if (offset.value) params.offset = offset.value;
      else if (time.value) params.time_ms = new Date(time.value).getTime();
      const b = await api("records?" + q(params));
      results.replaceChildren(el("p", { className: "note" }, `From offset ${b.from}; the partition holds ${b.start}–${b.end}.`),
        table(["Offset", "Time", "Key", "Headers", "Value"], b.records.map((x) => el("tr", { className: "record" },
          el("td", { className: "num" }, x.offset),
          el("td", {}, fmtTime(x.timestamp_ms)),
          el("td", {}, shown(x.key)),
          el("td", {}, x.headers.map((h) => el("div", {}, shown(h.key), " = ", shown(h.value)))),
          el("td", { className: "value" }, shown(x.value)))), "records-table"));
    });
  } }, part, offset, "or from", time, el("button", { type: "submit", id: "browse-button" }, "Browse"));
  view(el("h1", {}, "Topic ", el("span", { id: "topic-name" }, name)),
    el("p", {}, `${t.partitions.length} partition(s); retention ${t.retention_ms ? fmtAge(t.retention_ms) : "forever"}, ${t.retention_bytes ? fmtBytes(t.retention_bytes) : "unbounded"}.`),
    browse, results);
}

async function pageGroups() {
  const r = await api("groups");
  const rows = r.groups.map((g) => el("tr", { "data-group": g.name },
    el("td", {}, el("a", { href: "#/group/" + encodeURIComponent(g.name) }, g.name)),
    el("td", { className: "num group-lag" }, g.lag)));
  view(el("h1", {}, "Consumer groups"), rows.length ? table(["Group", "Total lag (records)"], rows, "groups-table") : el("p", { className: "note" }, "No consumer groups in this account."));
}

async function pageGroup(name) {
  const members = el("div", { id: "group-members" });
  const lags = el("div", { id: "group-lags" });
  const charts = el("div", { className: "charts" });
  // One line per partition, made when the partitions are first known (and again if they change).
  let lagChart = null;
  let lagKeys = "";
  view(el("h1", {}, "Consumer group ", el("span", { id: "group-name" }, name)),
    el("h2", {}, "Members and assignments"), members, el("h2", {}, "Lag per partition"), lags, charts);
  every(2000, () => guarded(async () => {
    const g = await api("group?" + q({ name }));
    members.replaceChildren(g.members.length ? table(["Member", "Assigned partitions"], g.members.map((m) => el("tr", {},
      el("td", {}, m.member), el("td", {}, m.assignments.map((a) => `${a.topic}[${a.partition}]`).join(", "))))) : el("p", { className: "note" }, `No live members (generation ${g.generation === null ? "–" : g.generation}).`));
    lags.replaceChildren(table(["Topic", "Partition", "Committed", "Latest", "Lag"], g.partitions.map((p) => el("tr", { className: "lag-row" },
      el("td", {}, p.topic), el("td", { className: "num" }, p.partition), el("td", { className: "num" }, p.committed),
      el("td", { className: "num" }, p.latest), el("td", { className: "num lag" }, p.lag))), "lag-table"));
    const keys = g.partitions.map((p) => `${p.topic}[${p.partition}]`);
    if (keys.join(",") !== lagKeys) {
      lagKeys = keys.join(",");
      lagChart = chart("chart-lag", "Lag per partition (records) over time", keys);
      charts.replaceChildren(lagChart.box);
    }
    lagChart.push(g.now_ms, g.partitions.map((p) => p.lag));
  }));
}

async function pageAccount() {
  const a = await api("account");
  const un = (v) => (v === null || v === undefined ? "unlimited" : v);
  view(el("h1", {}, "Account ", el("span", { id: "account-id" }, a.account)),
    table(["", ""], [
      el("tr", {}, el("td", {}, "Authentication"), el("td", {}, a.auth_mode === "sigv4" ? "SigV4 (keys checked)" : "off: every caller is this account")),
      el("tr", {}, el("td", {}, "Access key ids"), el("td", {}, a.access_key_ids.join(", ") || "–")),
      el("tr", {}, el("td", {}, "Queues"), el("td", {}, `${a.queues} of at most ${a.quotas.queues_per_account}`)),
      el("tr", {}, el("td", {}, "Topics"), el("td", {}, a.topics)),
      el("tr", {}, el("td", {}, "Requests per second"), el("td", {}, un(a.quotas.requests_per_s))),
      el("tr", {}, el("td", {}, "Request bytes per second"), el("td", {}, a.quotas.bytes_per_s ? fmtBytes(a.quotas.bytes_per_s) : "unlimited")),
      el("tr", {}, el("td", {}, "Stored bytes"), el("td", {}, a.quotas.stored_bytes_per_account ? fmtBytes(a.quotas.stored_bytes_per_account) : "unlimited")),
    ], "account-table"));
}

function showLogin() {
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  document.getElementById("nav").hidden = true;
  const id = el("input", { id: "login-key", name: "access_key_id", autocomplete: "username" });
  const secret = el("input", { id: "login-secret", name: "secret", type: "password", autocomplete: "current-password" });
  view(el("form", { className: "login", id: "login-form", onsubmit: (ev) => {
    ev.preventDefault();
    guarded(async () => {
      const r = await api("login", { access_key_id: id.value, secret: secret.value });
      state.csrf = r.csrf; state.account = r.account; state.auth = r.auth;
      document.getElementById("nav").hidden = false;
      showWho();
      if (!location.hash || location.hash === "#/login") location.hash = "#/overview"; else route();
    });
  } }, el("h1", {}, "Log in to Sluice"), el("label", { for: "login-key" }, "Access key id"), id,
    el("label", { for: "login-secret" }, "Secret"), secret, el("div", { className: "row" }, el("button", { type: "submit", id: "login-button" }, "Log in"))));
}

function showWho() {
  document.getElementById("who").textContent = `account ${state.account}` + (state.auth ? "" : " (auth off)");
  document.getElementById("logout").hidden = !state.auth;
}

// ---------------------------------------------------------------- routing

async function route() {
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  document.getElementById("flash").replaceChildren();
  const [, page, ...rest] = (location.hash || "#/overview").split("/");
  const arg = decodeURIComponent(rest.join("/"));
  for (const a of document.querySelectorAll("#nav a")) {
    a.className = a.id === "nav-" + page || (a.id === "nav-queues" && page === "queue") || (a.id === "nav-topics" && page === "topic") || (a.id === "nav-groups" && page === "group") ? "active" : "";
  }
  const pages = { overview: pageOverview, queues: pageQueues, queue: pageQueue, topics: pageTopics, topic: pageTopic, groups: pageGroups, group: pageGroup, account: pageAccount };
  const fn = pages[page] || pageOverview;
  await guarded(() => fn(arg));
}

async function boot() {
  document.getElementById("logout").addEventListener("click", () => guarded(async () => {
    await api("logout", {});
    state.csrf = "";
    showLogin();
  }));
  window.addEventListener("hashchange", () => { if (state.csrf) route(); });
  const s = await api("session");
  if (s.login_required) { showLogin(); return; }
  state.csrf = s.csrf; state.account = s.account; state.auth = s.auth;
  showWho();
  await route();
}

document.addEventListener("DOMContentLoaded", () => guarded(boot));
