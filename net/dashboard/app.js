// The PicoMQ dashboard: polls the admin API and renders it. No framework, no build step.
"use strict";

const POLL_MS = Number(new URLSearchParams(location.search).get("interval") || 1000);
const HISTORY = 120; // samples kept for the chart
const history = []; // { t, appends, reads }
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
  if (previous) {
    const seconds = Math.max(0.001, (stats.uptimeMs - previous.uptimeMs) / 1000);
    const p = previous.total;
    const appends = rate(t, p, "appends", seconds);
    const reads = rate(t, p, "reads", seconds);
    text("append-rate", fmtInt(Math.round(appends)));
    text("read-rate", fmtInt(Math.round(reads)));
    text("bytes-in-rate", (rate(t, p, "bytesAppended", seconds) / 1048576).toFixed(2));
    text("bytes-out-rate", (rate(t, p, "bytesRead", seconds) / 1048576).toFixed(2));
    history.push({ appends, reads });
    if (history.length > HISTORY) history.shift();
    drawChart();
  }
  previous = stats;
  const body = $("cores-table").tBodies[0];
  body.replaceChildren(...stats.cores.map((c) => row([
    c.core, fmtInt(c.streams), fmtInt(c.appends), fmtInt(c.recordsAppended), fmtInt(c.reads),
    fmtInt(c.liveWaiters), fmtInt(c.connections), fmtBytes(c.uploadBacklogBytes), fmtBytes(c.memoryBytes),
  ], { "data-core": c.core })));
}

function drawChart() {
  const canvas = $("chart");
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  const max = Math.max(1, ...history.map((h) => Math.max(h.appends, h.reads)));
  const x = (i) => (i / (HISTORY - 1)) * width;
  const y = (v) => height - 4 - (v / max) * (height - 18);
  ctx.fillStyle = "#888";
  ctx.font = "11px sans-serif";
  ctx.fillText(`${fmtInt(Math.round(max))}/s`, 4, 11);
  for (const [key, color] of [["appends", "#2f7de1"], ["reads", "#e1882f"]]) {
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    history.forEach((h, i) => {
      const px = x(i + HISTORY - history.length);
      if (i === 0) ctx.moveTo(px, y(h[key])); else ctx.lineTo(px, y(h[key]));
    });
    ctx.stroke();
  }
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
    const detail = await loadDetail();
    renderReady(ready.status, ready.body);
    renderCluster(cluster);
    renderStats(stats);
    renderStreams(streams);
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
$("search").addEventListener("input", () => loadStreams().then(renderStreams).catch(() => {}));
const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromHash) sessionStorage.setItem("pico-admin-token", fromHash);
poll();
setInterval(poll, POLL_MS);
