// The PicoMQ dashboard: polls the admin API and renders it. No framework, no build step.
"use strict";

const POLL_MS = Number(new URLSearchParams(location.search).get("interval") || 1000);
// The charts keep up to the longest window of samples (and never more than HISTORY_MAX).
const WINDOW_MAX_MS = 15 * 60 * 1000;
const HISTORY_MAX = 5000;
// A chart spans at least this much time, so its first points do not fill it edge to edge.
const SPAN_MIN_MS = 30 * 1000;
const TICK_STEPS_MS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600].map((s) => s * 1000);
const TICKS_MAX = 6;
// Status codes by which the node declines work (a limit or its state): net/src/admin/metrics.rs.
const REFUSALS = { 413: "body too large", 429: "too much in flight", 431: "head too large",
  503: "unavailable", 507: "out of storage" };
const history = []; // { t (node's clock, ms), appends, reads, appendP50, ..., errors, refusals }
let windowMs = 5 * 60 * 1000;
let previous = null; // last /admin/stats answer, for rates
let selected = null; // stream shown in the detail panel

const $ = (id) => document.getElementById(id);

function token() {
  return $("token").value.trim() || sessionStorage.getItem("pico-admin-token") || "";
}

async function api(path) {
  const headers = {};
  const t = token();
  if (t) headers.authorization = `Bearer ${t}`;
  const res = await fetch(path, { headers, cache: "no-store" });
  const body = res.headers.get("content-type")?.includes("json") ? await res.json() : await res.text();
  if (!res.ok && path !== "/ready") throw new Error(`${path}: ${res.status} ${body.error ?? ""}`);
  return { status: res.status, body };
}

const fmtInt = (n) => Number(n).toLocaleString("en-US");
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}
function fmtDuration(ms) {
  const s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
}
const rate = (now, before, key, seconds) => Math.max(0, (now[key] - before[key]) / seconds);
function fmtRate(v) {
  if (v >= 1000) return `${(v / 1000).toFixed(1)}k`;
  return v >= 10 || v === 0 ? String(Math.round(v)) : v.toFixed(1);
}
function fmtMs(ms) {
  if (ms == null) return "–";
  if (ms === 0) return "0 ms";
  return ms >= 100 ? `${Math.round(ms)} ms` : ms >= 1 ? `${ms.toFixed(1)} ms` : `${ms.toFixed(2)} ms`;
}
const pad2 = (n) => String(n).padStart(2, "0");
const fmtClock = (t) => { const d = new Date(t); return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`; };
const fmtSpan = (ms) => ms >= 60000 ? `${Math.round(ms / 60000)} min` : `${Math.round(ms / 1000)} s`;

// The q-quantile (0..1) in µs of the samples a cumulative histogram gained since `before`
// (same shape; null: since the start), interpolated inside its bucket like Prometheus'
// histogram_quantile; null without samples. Above the last bound it answers that bound.
function quantileUs(bounds, now, before, q) {
  const delta = now.buckets.map((c, i) => c - (before ? before.buckets[i] : 0));
  const total = delta[delta.length - 1];
  if (!(total > 0)) return null;
  const rank = q * total;
  for (let i = 0; i < delta.length; i += 1) {
    if (delta[i] < rank) continue;
    if (i >= bounds.length) return bounds[bounds.length - 1];
    const lower = i === 0 ? 0 : bounds[i - 1];
    const below = i === 0 ? 0 : delta[i - 1];
    const inside = delta[i] - below;
    return lower + (bounds[i] - lower) * (inside > 0 ? (rank - below) / inside : 1);
  }
  return null;
}
const quantileMs = (latency, key, before, q) => {
  const us = quantileUs(latency.boundsUs, latency[key], before ? before[key] : null, q);
  return us == null ? null : us / 1000;
};

function text(id, value) { $(id).textContent = value; }

function row(cells, attrs = {}) {
  const tr = document.createElement("tr");
  for (const [k, v] of Object.entries(attrs)) tr.setAttribute(k, v);
  for (const cell of cells) {
    const td = document.createElement("td");
    td.textContent = cell;
    tr.appendChild(td);
  }
  return tr;
}

function renderReady(status, body) {
  const pill = $("ready");
  const ready = status === 200 && body.ready;
  pill.textContent = ready ? "ready" : "not ready";
  pill.className = `pill ${ready ? "ok" : "bad"}`;
}

function renderCluster(c) {
  text("node-id", `node ${c.nodeId}`);
  text("advertised", c.advertisedAddress);
  text("cluster-id", c.clusterId);
  text("durability", `durability ${c.durability}`);
  text("stream-count", fmtInt(c.streamCount));
  text("object-count", fmtInt(c.objectCount));
  text("uptime", fmtDuration(c.uptimeMs));
  text("cores", `${c.cores} cores`);
  text("version", `pico ${c.version} (commit ${c.commit})`);
}

function renderStats(stats) {
  const t = stats.total;
  text("records-appended", fmtInt(t.recordsAppended));
  text("upload-backlog", fmtBytes(t.uploadBacklogBytes));
  renderStorage(stats.storage);
  renderResponseTotals(stats.responses);
  if (previous) {
    const seconds = Math.max(0.001, (stats.uptimeMs - previous.uptimeMs) / 1000);
    const p = previous.total;
    const r = stats.responses, pr = previous.responses;
    const refused = (answers) => Object.values(answers.refused).reduce((a, b) => a + b, 0);
    const sample = {
      t: stats.nowMs,
      appends: rate(t, p, "appends", seconds),
      reads: rate(t, p, "reads", seconds),
      appendP50: quantileMs(stats.latency, "append", previous.latency, 0.5),
      appendP99: quantileMs(stats.latency, "append", previous.latency, 0.99),
      fsyncP50: quantileMs(stats.latency, "fsync", previous.latency, 0.5),
      fsyncP99: quantileMs(stats.latency, "fsync", previous.latency, 0.99),
      errors: rate(r, pr, "serverErrors", seconds),
      clientErrors: rate(r, pr, "clientErrors", seconds),
      refusals: Math.max(0, (refused(r) - refused(pr)) / seconds),
    };
    text("append-rate", fmtInt(Math.round(sample.appends)));
    text("read-rate", fmtInt(Math.round(sample.reads)));
    text("bytes-in-rate", (rate(t, p, "bytesAppended", seconds) / 1048576).toFixed(2));
    text("bytes-out-rate", (rate(t, p, "bytesRead", seconds) / 1048576).toFixed(2));
    text("error-rate", fmtRate(sample.errors));
    text("refusal-rate", fmtRate(sample.refusals));
    text("client-error-rate", fmtRate(sample.clientErrors));
    history.push(sample);
    while (history.length > HISTORY_MAX || (history.length && history[0].t < sample.t - WINDOW_MAX_MS)) history.shift();
    renderLatencyTiles();
    drawCharts();
  }
  previous = stats;
  const body = $("cores-table").tBodies[0];
  body.replaceChildren(...stats.cores.map((c) => row([
    c.core, fmtInt(c.streams), fmtInt(c.appends), fmtInt(c.recordsAppended), fmtInt(c.reads),
    fmtInt(c.liveWaiters), fmtInt(c.connections), fmtBytes(c.uploadBacklogBytes), fmtBytes(c.memoryBytes),
  ], { "data-core": c.core })));
}

function renderStorage(storage) {
  const known = [storage.walBytes, storage.metaBytes].filter((b) => b != null);
  text("disk-bytes", known.length ? fmtBytes(known.reduce((a, b) => a + b, 0)) : "–");
  const parts = [];
  if (storage.walBytes != null) parts.push(`WAL ${fmtBytes(storage.walBytes)}`);
  if (storage.metaBytes != null) parts.push(`catalog ${fmtBytes(storage.metaBytes)}`);
  text("disk-detail", parts.length ? parts.join(" · ") : "not measured yet");
  text("bucket-bytes", storage.bucketBytes == null ? "–" : fmtBytes(storage.bucketBytes));
  text("bucket-segments", storage.bucketSegments == null ? "not measured yet"
    : `${fmtInt(storage.bucketSegments)} segments in the catalog`);
}

function renderResponseTotals(responses) {
  text("error-total", fmtInt(responses.serverErrors));
  const codes = Object.entries(responses.refused);
  text("refusal-total", fmtInt(codes.reduce((sum, [, n]) => sum + n, 0)));
  $("refusal-codes").replaceChildren(...codes.filter(([, n]) => n > 0).map(([code, n]) => {
    const li = document.createElement("li");
    li.dataset.code = code;
    li.dataset.count = n;
    li.textContent = `${code} ${REFUSALS[code] ?? ""}: ${fmtInt(n)}`;
    return li;
  }));
}

// The latest percentile each series has (an interval without appends has none).
function renderLatencyTiles() {
  for (const [id, key] of [["append-p50", "appendP50"], ["append-p99", "appendP99"],
    ["fsync-p50", "fsyncP50"], ["fsync-p99", "fsyncP99"]]) {
    const last = [...history].reverse().find((h) => h[key] != null);
    text(id, fmtMs(last ? last[key] : null));
  }
}

// The smallest 1-2-5 number at or above v.
function niceCeil(v) {
  if (!(v > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * power).find((n) => n >= v * (1 - 1e-9));
}

const SVG_NS = "http://www.w3.org/2000/svg";
function svg(name, attrs, content) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (content != null) el.textContent = content;
  return el;
}

// A line chart of `series` ({ key, cls }) over the history, on a time axis ending at the last
// sample: the window, or less while the history is shorter (at least SPAN_MIN_MS).
function drawChart(id, series, fmtValue) {
  const chart = $(id);
  const [width, height] = chart.getAttribute("viewBox").split(" ").slice(2).map(Number);
  const box = { left: 58, right: width - 10, top: 10, bottom: height - 22 };
  const now = history.length ? history[history.length - 1].t : Date.now();
  const span = Math.min(windowMs, Math.max(SPAN_MIN_MS, now - (history.length ? history[0].t : now)));
  const from = now - span;
  const shown = history.filter((h) => h.t >= from);
  const max = niceCeil(Math.max(0, ...shown.flatMap((h) => series.map((s) => h[s.key] ?? 0))));
  const x = (t) => box.left + ((t - from) / span) * (box.right - box.left);
  const y = (v) => box.bottom - (v / max) * (box.bottom - box.top);
  const parts = [];
  for (const v of [0, max / 2, max]) {
    parts.push(svg("line", { class: "grid", x1: box.left, x2: box.right, y1: y(v), y2: y(v) }));
    parts.push(svg("text", { class: "y-label", x: box.left - 6, y: y(v) + 4, "text-anchor": "end" }, fmtValue(v)));
  }
  const step = TICK_STEPS_MS.find((s) => span / s <= TICKS_MAX) ?? TICK_STEPS_MS[TICK_STEPS_MS.length - 1];
  const axis = svg("g", { class: "x-axis", "data-span-ms": span });
  for (let t = Math.ceil(from / step) * step; t <= now; t += step) {
    axis.appendChild(svg("line", { class: "tick", x1: x(t), x2: x(t), y1: box.bottom, y2: box.bottom + 4 }));
    axis.appendChild(svg("text", { class: "time", x: x(t), y: height - 6, "text-anchor": "middle" }, fmtClock(t)));
  }
  axis.appendChild(svg("line", { class: "axis", x1: box.left, x2: box.right, y1: box.bottom, y2: box.bottom }));
  parts.push(axis);
  for (const s of series) {
    // A sample without a value (no appends in that interval) breaks the line.
    let d = "", points = 0, pen = "M", top = 0;
    for (const h of shown) {
      const v = h[s.key];
      if (v == null) { pen = "M"; continue; }
      d += `${pen}${x(h.t).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
      points += 1;
      top = Math.max(top, v);
    }
    parts.push(svg("path", {
      class: `series ${s.cls}`, "data-series": s.key, "data-points": points, "data-max": top, d: d.trim() || "M0,0",
    }));
  }
  chart.dataset.window = `last ${fmtSpan(span)}`;
  chart.replaceChildren(...parts);
}

function drawCharts() {
  drawChart("traffic-chart", [{ key: "appends", cls: "appends" }, { key: "reads", cls: "reads" }], (v) => `${fmtRate(v)}/s`);
  drawChart("latency-chart", [
    { key: "appendP50", cls: "append-p50" }, { key: "appendP99", cls: "append-p99" },
    { key: "fsyncP50", cls: "fsync-p50" }, { key: "fsyncP99", cls: "fsync-p99" },
  ], fmtMs);
  drawChart("errors-chart", [
    { key: "errors", cls: "errors" }, { key: "refusals", cls: "refusals" },
    { key: "clientErrors", cls: "client-errors" },
  ], (v) => `${fmtRate(v)}/s`);
}

async function loadStreams() {
  const prefix = $("search").value.trim() || "/";
  return (await api(`/admin/streams?prefix=${encodeURIComponent(prefix)}&limit=100`)).body;
}

function renderStreams(body) {
  const tbody = $("streams-table").tBodies[0];
  tbody.replaceChildren(...body.streams.map((s) => {
    const tr = row([s.name, s.contentType, fmtInt(s.startOffset), fmtInt(s.endOffset), s.closed ? "yes" : "no"],
      { "data-name": s.name, "data-next": s.endOffset });
    tr.addEventListener("click", () => { selected = s.name; loadDetail().then(renderDetail).catch(() => {}); });
    return tr;
  }));
  $("more").hidden = !body.hasMore;
}

// One row per stream of each named consumer (docs/consumers.md): where it stands, the
// stream's tail where this node serves it, and the lag between them.
function renderConsumers(body) {
  const dash = (v) => (v == null ? "–" : fmtInt(v));
  $("consumers-table").tBodies[0].replaceChildren(...body.consumers.flatMap((c) =>
    c.streams.map((s) => row(
      [c.consumer, c.protocol, c.group ? "group" : "single", s.stream, fmtInt(s.next_seq), dash(s.tail), dash(s.lag)],
      { "data-consumer": c.consumer, "data-lag": s.lag ?? "" },
    ))));
  $("consumers-more").hidden = !body.hasMore;
}

async function loadDetail() {
  return selected ? (await api(`/admin/streams${selected}`)).body : null;
}

// The stream's retention policy as one line: each limit that is on, or "keeps everything".
function retentionText(retention) {
  if (!retention) return "keeps everything";
  const parts = [];
  if (retention.ageSeconds != null) parts.push(`records younger than ${retention.ageSeconds} s`);
  if (retention.bytes != null) parts.push(`at most ${fmtInt(retention.bytes)} bytes`);
  if (retention.deleteOnEmptySeconds != null) {
    parts.push(`deleted when empty for ${retention.deleteOnEmptySeconds} s`);
  }
  return parts.length ? parts.join(", ") : "keeps everything";
}

function renderDetail(body) {
  if (!body) return;
  $("detail").hidden = false;
  text("detail-name", body.name);
  const fields = [
    ["id", body.streamId], ["content type", body.contentType], ["first offset", body.startOffset],
    ["next offset", body.endOffset], ["closed", body.closed ? "yes" : "no"],
    ["TTL", body.ttlSeconds == null ? "none" : `${body.ttlSeconds} s`],
    ["expires", body.expiresAt ?? "never"], ["owner", `node ${body.ownerNodeId} (${body.ownerAdvertisedAddress})`],
    ["retention", retentionText(body.retention)],
  ];
  $("detail-fields").replaceChildren(...fields.flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    return [dt, dd];
  }));
}

async function poll() {
  try {
    // Every answer first, then one render: a poll shows one consistent state, and the pill
    // does not flip to "ready" each time while the data requests are being refused.
    const ready = await api("/ready");
    const cluster = (await api("/admin/cluster")).body;
    const stats = (await api("/admin/stats")).body;
    const streams = await loadStreams();
    const consumers = (await api("/admin/consumers")).body;
    const detail = await loadDetail();
    renderReady(ready.status, ready.body);
    renderCluster(cluster);
    renderStats(stats);
    renderStreams(streams);
    renderConsumers(consumers);
    renderDetail(detail);
    text("status", `updated ${new Date().toLocaleTimeString()}`);
    document.body.dataset.loaded = "true";
  } catch (e) {
    $("ready").textContent = "unreachable";
    $("ready").className = "pill bad";
    text("status", `error: ${e.message}`);
  }
}

$("token").addEventListener("change", () => {
  sessionStorage.setItem("pico-admin-token", $("token").value.trim());
  poll();
});
for (const button of document.querySelectorAll("[data-window-ms]")) {
  button.addEventListener("click", () => {
    windowMs = Number(button.dataset.windowMs);
    for (const b of document.querySelectorAll("[data-window-ms]")) b.setAttribute("aria-pressed", String(b === button));
    drawCharts();
  });
}
$("search").addEventListener("input", () => loadStreams().then(renderStreams).catch(() => {}));
const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromHash) sessionStorage.setItem("pico-admin-token", fromHash);
poll();
setInterval(poll, POLL_MS);
