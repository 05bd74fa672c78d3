// epochstream job dashboard: polls the job endpoint's REST API once a second.
// The page never sees the job's token: `epochstream status JOB --open` (or a one-time
// /dashboard/login?code=... URL) signs the browser in with an HttpOnly, SameSite=Strict
// session cookie scoped to /v1/, which the browser sends with every API call.
"use strict";

const TERMINAL = new Set(["FINISHED", "FAILED", "CANCELED"]);
const COLORS = ["#2f6fdb", "#d9822b", "#2c9c5a", "#b5399b", "#7c5cd6", "#c23b3b", "#1f9aa8"];
const state = { graph: null, charts: null, open: new Set(), ended: false };

const SIGN_IN = "Not signed in (or the job's endpoint restarted): run `epochstream status JOB_ID --open`.";

class SignedOut extends Error {}

async function api(path) {
  // The header marks the call as this page's own: the endpoint refuses a cookie-signed
  // POST without it, and another site cannot add it without a CORS preflight.
  const reply = await fetch(path, {
    credentials: "same-origin",
    headers: { "X-Requested-With": "epochstream-dashboard" },
    cache: "no-store",
  });
  if (reply.status === 401) throw new SignedOut(SIGN_IN);
  if (!reply.ok) throw new Error(path + ": HTTP " + reply.status);
  return reply.json();
}

function el(tag, attrs, ...children) {
  const node = attrs && attrs.svg
    ? document.createElementNS("http://www.w3.org/2000/svg", tag)
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key !== "svg") node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

const fmt = {
  int: (n) => (n == null ? "–" : Math.round(n).toLocaleString("en-US")),
  rate: (n) => (n == null ? "–" : n >= 1000 ? (n / 1000).toFixed(1) + "k" : n.toFixed(0)),
  pct: (ms) => (ms == null ? "–" : (ms / 10).toFixed(0) + "%"),
  bytes: (b) => {
    if (b == null) return "–";
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return b.toFixed(i ? 1 : 0) + " " + units[i];
  },
  secs: (s) => (s == null ? "–" : s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(2) + " s"),
  lag: (ms) => (ms == null ? "–" : (ms / 1000).toFixed(1) + " s"),
  time: (t) => (t == null ? "–" : new Date(t * 1000).toLocaleTimeString("en-GB")),
  duration: (s) => {
    s = Math.floor(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return (h ? h + "h " : "") + (h || m ? m + "m " : "") + (s % 60) + "s";
  },
};

function pressureClass(ms) {
  return ms >= 500 ? "high" : ms >= 100 ? "warn" : "ok";
}

// ------------------------------------------------------------------ job graph (plain SVG)

function layout(graph) {
  const depth = {};
  const inputs = {};
  for (const v of graph.vertices) inputs[v.id] = [];
  for (const e of graph.edges) inputs[e.target].push(e.source);
  const depthOf = (id) => {
    if (depth[id] === undefined) {
      depth[id] = 0;
      depth[id] = inputs[id].length ? 1 + Math.max(...inputs[id].map(depthOf)) : 0;
    }
    return depth[id];
  };
  const columns = [];
  for (const v of graph.vertices) (columns[depthOf(v.id)] ||= []).push(v.id);
  const W = 330, H = 78, GX = 90, GY = 26;
  const pos = {};
  columns.forEach((ids, c) => ids.forEach((id, r) => { pos[id] = { x: 20 + c * (W + GX), y: 20 + r * (H + GY) }; }));
  const rows = Math.max(...columns.map((c) => c.length));
  return { pos, W, H, width: 40 + columns.length * (W + GX) - GX, height: 40 + rows * (H + GY) - GY };
}

function drawGraph(graph) {
  const svg = document.getElementById("graph");
  const { pos, W, H, width, height } = layout(graph);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("height", String(height));
  svg.replaceChildren();
  const defs = el("defs", { svg: 1 },
    el("marker", { svg: 1, id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto" },
      el("path", { svg: 1, d: "M0,0 L10,5 L0,10 z", fill: "#8a93a6" })));
  svg.append(defs);
  for (const e of graph.edges) {
    const a = pos[e.source], b = pos[e.target];
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
    svg.append(el("path", { svg: 1, class: "edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` }));
    svg.append(el("text", { svg: 1, class: "edge-label", x: String(mx - 22), y: String((y1 + y2) / 2 - 6) }, e.partitioning));
  }
  for (const v of graph.vertices) {
    const { x, y } = pos[v.id];
    const name = v.name.length > 42 ? v.name.slice(0, 41) + "…" : v.name;
    const g = el("g", { svg: 1, class: "vertex ok", "data-id": v.id },
      el("rect", { svg: 1, x: String(x), y: String(y), width: String(W), height: String(H) }),
      el("title", { svg: 1 }, v.name),
      el("text", { svg: 1, class: "name", x: String(x + 10), y: String(y + 20) }, name),
      el("text", { svg: 1, class: "rate", x: String(x + 10), y: String(y + 42) }, "– records/s"),
      el("text", { svg: 1, class: "load", x: String(x + 10), y: String(y + 62) }, `parallelism ${v.parallelism}`));
    svg.append(g);
  }
}

function updateGraph(vertices) {
  for (const v of vertices) {
    const g = document.querySelector(`#graph g.vertex[data-id="${CSS.escape(v.id)}"]`);
    if (!g) continue;
    g.setAttribute("class", "vertex " + pressureClass(v.backpressured_ms_per_s));
    g.querySelector("text.rate").textContent = `${fmt.rate(v.rate)} records/s · ${fmt.int(v.is_source ? v.records_out : v.records_in)} total`;
    g.querySelector("text.load").textContent =
      `busy ${fmt.pct(v.busy_ms_per_s)} · backpressured ${fmt.pct(v.backpressured_ms_per_s)} · p${v.parallelism}`;
  }
}

// ------------------------------------------------------------------ charts (uPlot)

function makeChart(target, series, yLabel) {
  const width = Math.max(document.getElementById(target).clientWidth - 10, 300);
  const opts = {
    width, height: 220,
    scales: { x: { time: true } },
    series: [{}, ...series.map((s, i) => ({ label: s, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true }))],
    axes: [
      { space: 70, values: (u, ticks) => ticks.map((t) => new Date(t * 1000).toLocaleTimeString("en-GB")) },
      { label: yLabel, size: 60 },
    ],
    legend: { show: true },
  };
  return new uPlot(opts, [[], ...series.map(() => [])], document.getElementById(target));
}

function updateCharts(points) {
  if (!state.charts) return;
  const times = points.map((p) => p.time);
  const ids = state.graph.vertices.map((v) => v.id);
  state.charts.rates.setData([times, ...ids.map((id) => points.map((p) => p.rates[id] ?? null))]);
  state.charts.lag.setData([times, points.map((p) => (p.watermark_lag_ms == null ? null : p.watermark_lag_ms / 1000))]);
}

// ------------------------------------------------------------------ tables

function cell(text) { return el("td", null, String(text)); }

function updateVertices(vertices) {
  const rows = vertices.map((v) => el("tr", { "data-id": v.id, class: "vertex-row" },
    cell(v.name), cell(v.parallelism), cell(fmt.int(v.records_in)), cell(fmt.int(v.records_out)),
    cell(fmt.rate(v.records_in_per_s)), cell(fmt.rate(v.records_out_per_s)), cell(fmt.pct(v.busy_ms_per_s)),
    cell(fmt.pct(v.backpressured_ms_per_s)), cell((v.queue_fill * 100).toFixed(0) + "%"),
    cell(fmt.lag(v.watermark_lag_ms)), cell(fmt.bytes(v.state_size))));
  document.querySelector("#vertices tbody").replaceChildren(...rows);
}

function maxOf(tasks, key) {
  const values = Object.values(tasks).map((t) => t[key]);
  return values.length ? Math.max(...values) : null;
}

// "aligned", or "unaligned · 1.2 MB": whether snapshots overtook in-flight records, and
// how many bytes of them (channel state) were kept.
function inFlight(unaligned, bytes) {
  return unaligned ? `unaligned · ${fmt.bytes(bytes || 0)}` : "aligned";
}

function updateCheckpoints(reply) {
  const body = document.querySelector("#checkpoints tbody");
  const rows = [];
  for (const c of reply.checkpoints.slice(-30).reverse()) {
    const id = String(c.checkpoint_id);
    const row = el("tr", { class: "checkpoint", "data-id": id, title: "click for per-task details" },
      cell((state.open.has(id) ? "▾ " : "▸ ") + id), cell(c.kind), cell(fmt.time(c.trigger_time + c.duration)),
      cell(fmt.secs(c.duration)), cell(fmt.bytes(c.state_size)), cell(fmt.secs(maxOf(c.tasks, "alignment_s"))),
      cell(fmt.secs(maxOf(c.tasks, "sync_s"))), cell(fmt.secs(maxOf(c.tasks, "async_s"))),
      cell(inFlight(Object.values(c.tasks).some((t) => t.unaligned),
        Object.values(c.tasks).reduce((sum, t) => sum + (t.channel_state_bytes || 0), 0))));
    row.addEventListener("click", () => {
      state.open.has(id) ? state.open.delete(id) : state.open.add(id);
      updateCheckpoints(reply);
    });
    rows.push(row);
    if (state.open.has(id)) {
      const tasks = Object.entries(c.tasks).sort().map(([task, t]) => el("tr", null,
        cell(task), cell(fmt.secs(t.alignment_s)), cell(fmt.secs(t.sync_s)), cell(fmt.secs(t.async_s)),
        cell(fmt.bytes(t.state_size)), cell(inFlight(t.unaligned, t.channel_state_bytes))));
      const inner = el("table", null,
        el("thead", null, el("tr", null,
          ...["task", "alignment", "sync", "async", "state", "in flight"].map((h) => el("th", null, h)))),
        el("tbody", null, ...tasks));
      const td = el("td", { colspan: "9" }, inner);
      rows.push(el("tr", { class: "tasks" }, td));
    }
  }
  body.replaceChildren(...rows);
  const failed = document.getElementById("failed-checkpoints");
  failed.replaceChildren(...reply.failed.slice(-5).map((f) =>
    el("p", { class: "muted" }, `checkpoint ${f.checkpoint_id} failed at ${fmt.time(f.time)}: ${f.reason}`)));
}

function updateExceptions(exceptions) {
  const box = document.getElementById("exceptions");
  if (!exceptions.length) {
    box.replaceChildren(el("p", { class: "muted" }, "none"));
    return;
  }
  box.replaceChildren(...exceptions.slice().reverse().map((x) => el("details", { class: "exception" },
    el("summary", null, `attempt ${x.attempt} failed at ${fmt.time(x.time)}: ${x.message}`),
    el("pre", null, x.traceback || "(no traceback)"))));
}

function updateHeader(job, vertices) {
  document.title = `${job.name} · epochstream`;
  document.getElementById("job-name").textContent = job.name;
  const badge = document.getElementById("state");
  badge.textContent = job.state;
  badge.className = "state " + job.state;
  document.getElementById("job-id").textContent =
    `job ${job.job_id} · attempt ${job.attempt} · parallelism ${job.parallelism} · started ${fmt.time(job.started_at)}`;
  document.getElementById("uptime").textContent = fmt.duration(job.uptime_s);
  document.getElementById("restarts").textContent = String(job.restarts);
  document.getElementById("ckpt-counts").textContent =
    `${job.checkpoints_completed} / ${job.checkpoints_failed} / ${job.checkpoints_in_progress}`;
  document.getElementById("ckpt-last").textContent = job.last_checkpoint_id == null ? "–"
    : `#${job.last_checkpoint_id} · ${fmt.secs(job.last_checkpoint_duration_s)} · ${fmt.bytes(job.last_checkpoint_size)}`;
  const sources = vertices.filter((v) => v.is_source);
  document.getElementById("throughput").textContent = fmt.rate(sources.reduce((a, v) => a + v.rate, 0));
  const lags = vertices.map((v) => v.watermark_lag_ms).filter((x) => x != null);
  document.getElementById("lag").textContent = lags.length ? fmt.lag(Math.max(...lags)) : "–";
  // The job master's own words (GET /v1/job storage_message): shown while storage is down.
  const storage = document.getElementById("storage-status");
  storage.hidden = !job.storage_message;
  storage.textContent = job.storage_message || "";
}

function notice(text) {
  const box = document.getElementById("notice");
  box.hidden = !text;
  box.textContent = text || "";
}

// ------------------------------------------------------------------ polling

async function refresh() {
  const [job, vertices, history, checkpoints, exceptions] = await Promise.all([
    api("/v1/job"), api("/v1/job/vertices"), api("/v1/job/history"), api("/v1/checkpoints"), api("/v1/exceptions"),
  ]);
  if (!state.graph) {
    state.graph = job.graph;
    drawGraph(job.graph);
    const names = job.graph.vertices.map((v) => v.name);
    state.charts = { rates: makeChart("chart-rates", names, "records/s"), lag: makeChart("chart-lag", ["max lag"], "s") };
  }
  updateHeader(job, vertices.vertices);
  updateGraph(vertices.vertices);
  updateCharts(history.points);
  updateVertices(vertices.vertices);
  updateCheckpoints(checkpoints);
  updateExceptions(exceptions.exceptions);
  state.ended = TERMINAL.has(job.state);
  notice(state.ended ? `The job ended (${job.state}); this is its final state.` : "");
}

async function loop() {
  try {
    await refresh();
  } catch (err) {
    if (err instanceof SignedOut) {
      notice(SIGN_IN);
      return;  // nothing to poll until the browser signs in
    }
    notice(state.graph
      ? `The job endpoint stopped answering (${err.message}); showing the last state seen.`
      : `Cannot load the job: ${err.message}.`);
    if (state.graph) return;  // the endpoint is gone: keep the last state on screen
  }
  if (!state.ended) setTimeout(loop, 1000);
}

// Pages of an older version kept the token in sessionStorage: drop it.
sessionStorage.removeItem("epochstream-token");
loop();
