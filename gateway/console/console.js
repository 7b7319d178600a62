// The skein console: plain JavaScript over the same REST API every client uses. The API key is
// kept in sessionStorage (this tab only) and sent as X-API-Key; it never goes into a URL. Every
// value from the API is written with textContent, never as HTML.
"use strict";

const KEY = "skein.apiKey";
const SVG = "http://www.w3.org/2000/svg";
const $ = (sel) => document.querySelector(sel);

let selectedRun = null;

function key() { return sessionStorage.getItem(KEY) || ""; }

// api calls the gateway's REST API under /api/v1/ and returns the decoded JSON body.
async function api(method, path, body) {
  return call(method, "/api/v1/" + path, body);
}

async function call(method, url, body) {
  const headers = { "X-API-Key": key() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!resp.ok) {
    const msg = (data && (data.detail || data.message || (data.error && data.error.message))) || text || resp.statusText;
    const err = new Error(resp.status + ": " + msg);
    err.status = resp.status;
    throw err;
  }
  return data;
}

function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c === undefined || c === null ? "" : String(c);
    tr.appendChild(td);
  }
  return tr;
}

function button(label, onclick) {
  const b = el("button", label, { type: "button" });
  b.addEventListener("click", (ev) => { ev.stopPropagation(); onclick(); });
  return b;
}

function status(msg, isError) {
  const s = $("#status");
  s.textContent = msg || "";
  s.className = isError ? "error" : "";
}

function fmtTime(t) { return t ? new Date(t).toLocaleString() : ""; }
function fmtBytes(n) { return n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : n >= 1024 ? (n / 1024).toFixed(1) + " KiB" : n + " B"; }
function ckptName(c) { return c ? c.checkpoint_id || c.tinker_path : ""; }

// kindAndName splits tinker://RUN/KIND/NAME into the REST path's {kind}/{name}.
function kindAndName(path) {
  const parts = path.replace(/^tinker:\/\//, "").split("/");
  return parts.slice(-2).map(encodeURIComponent).join("/");
}

async function loadRuns() {
  const data = await api("GET", "training_runs?limit=1000");
  const body = $("#runs tbody");
  body.replaceChildren();
  const runs = data.training_runs || [];
  for (const r of runs) {
    const tr = row([el("code", r.training_run_id), r.base_model, r.lora_rank, "",
      ckptName(r.last_checkpoint), ckptName(r.last_sampler_checkpoint), fmtTime(r.last_request_time)]);
    tr.className = "run" + (r.training_run_id === selectedRun ? " selected" : "");
    tr.dataset.run = r.training_run_id;
    tr.addEventListener("click", () => selectRun(r.training_run_id));
    body.appendChild(tr);
    if (body.children.length <= 100) fillStep(r.training_run_id, tr.children[3]);
  }
  if (runs.length === 0) body.appendChild(row(["No training runs yet."]));
  if (!selectedRun && runs.length > 0) await selectRun(runs[runs.length - 1].training_run_id);
  return runs;
}

// fillStep writes a run's step count into its cell (the metrics listing's step; one step row asked for).
async function fillStep(id, td) {
  try {
    td.textContent = String((await api("GET", "training_runs/" + encodeURIComponent(id) + "/metrics?limit=1")).step);
  } catch (e) { td.textContent = "?"; }
}

async function selectRun(id) {
  selectedRun = id;
  for (const tr of document.querySelectorAll("#runs tr.run")) tr.classList.toggle("selected", tr.dataset.run === id);
  $("#run-detail").hidden = false;
  $("#run-id").textContent = id;
  await Promise.all([loadMetrics(id), loadCheckpoints(id)]);
}

// loadMetrics pages through the run's steps and draws the loss and each other metric.
async function loadMetrics(id) {
  const steps = [];
  let after = 0;
  for (let page = 0; page < 10; page++) {
    const data = await api("GET", "training_runs/" + encodeURIComponent(id) + "/metrics?after_step=" + after);
    steps.push(...data.steps);
    if (!data.has_more || data.steps.length === 0) break;
    after = data.steps[data.steps.length - 1].step;
  }
  const charts = $("#charts");
  charts.replaceChildren();
  charts.appendChild(chart("loss", "loss (mean per token)", steps.filter((s) => s.loss !== undefined).map((s) => [s.step, s.loss])));
  const series = new Map();
  for (const s of steps) {
    for (const [group, m] of [["optim_step", s.optim_step], ["forward_backward", s.forward_backward]]) {
      for (const [k, v] of Object.entries(m || {})) {
        const name = group + " " + k;
        if (!series.has(name)) series.set(name, []);
        series.get(name).push([s.step, v]);
      }
    }
  }
  let i = 0;
  for (const [name, points] of series) charts.appendChild(chart("m" + i++, name, points));
}

// chart draws points [[step, value], …] as an SVG line with one circle per step.
function chart(id, title, points) {
  const W = 420, H = 200, L = 52, R = 12, T = 22, B = 26;
  const s = svg("svg", { id: "chart-" + id, class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-points": points.length });
  s.appendChild(svg("text", { x: L, y: 14, class: "title" }, title));
  s.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
  s.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
  if (points.length === 0) {
    s.appendChild(svg("text", { x: L + 10, y: H / 2 }, "no steps yet"));
    return s;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  s.appendChild(svg("polyline", { class: "line", points: points.map((p) => px(p[0]).toFixed(1) + "," + py(p[1]).toFixed(1)).join(" ") }));
  for (const [x, y] of points) {
    const c = svg("circle", { cx: px(x).toFixed(1), cy: py(y).toFixed(1), r: points.length > 200 ? 1 : 2.5, "data-step": x });
    c.appendChild(svg("title", {}, "step " + x + ": " + y.toPrecision(5)));
    s.appendChild(c);
  }
  s.appendChild(svg("text", { x: L - 4, y: T + 4, "text-anchor": "end" }, y1.toPrecision(3)));
  s.appendChild(svg("text", { x: L - 4, y: H - B, "text-anchor": "end" }, y0.toPrecision(3)));
  s.appendChild(svg("text", { x: L, y: H - 8 }, "step " + xs[0]));
  s.appendChild(svg("text", { x: W - R, y: H - 8, "text-anchor": "end" }, "step " + xs[xs.length - 1]));
  return s;
}

async function loadCheckpoints(id) {
  const data = await api("GET", "training_runs/" + encodeURIComponent(id) + "/checkpoints");
  const body = $("#checkpoints tbody");
  body.replaceChildren();
  const base = "training_runs/" + encodeURIComponent(id) + "/checkpoints/";
  for (const c of data.checkpoints || []) {
    const p = base + kindAndName(c.tinker_path);
    const actions = el("span");
    actions.append(
      button(c.public ? "Unpublish" : "Publish", () => act(api(c.public ? "DELETE" : "POST", p + "/publish"))),
      button("TTL", () => {
        const v = prompt("Expire after how many seconds? (empty: never)", "");
        if (v === null) return;
        act(api("PUT", p + "/ttl", { ttl_seconds: v.trim() === "" ? null : Number(v) }));
      }),
      button("Download", async () => {
        try { window.location.assign((await api("GET", p + "/archive")).url); } catch (e) { status(e.message, true); }
      }),
      button("Delete", () => { if (confirm("Delete " + c.tinker_path + "?")) act(api("DELETE", p)); }),
    );
    body.appendChild(row([el("code", c.tinker_path), c.checkpoint_type, fmtTime(c.time), fmtBytes(c.size_bytes),
      c.public ? "yes" : "no", c.expires_at ? fmtTime(c.expires_at) : "never", actions]));
  }
  if ((data.checkpoints || []).length === 0) body.appendChild(row(["No checkpoints."]));
}

async function act(p) {
  try { await p; await refresh(); } catch (e) { status(e.message, true); }
}

async function loadSessions() {
  const data = await api("GET", "sessions");
  const body = $("#sessions tbody");
  body.replaceChildren();
  const ids = (data.sessions || []).slice(-50).reverse();
  const details = await Promise.all(ids.map((id) => api("GET", "sessions/" + encodeURIComponent(id)).catch(() => null)));
  ids.forEach((id, i) => {
    const d = details[i] || {};
    body.appendChild(row([el("code", id), (d.training_run_ids || []).join(", "), (d.sampler_ids || []).join(", ")]));
  });
  if (ids.length === 0) body.appendChild(row(["No sessions."]));
}

async function loadPlayground(runs) {
  const sel = $("#pg-model");
  const keep = sel.value;
  sel.replaceChildren();
  const bases = new Set();
  for (const r of runs) {
    bases.add(r.base_model);
    if (r.last_sampler_checkpoint) sel.appendChild(el("option", r.last_sampler_checkpoint.tinker_path, { value: r.last_sampler_checkpoint.tinker_path }));
  }
  for (const b of bases) sel.appendChild(el("option", b + " (base)", { value: b }));
  if (keep) sel.value = keep;
}

// The playground samples through the OpenAI-compatible completions endpoint, which takes text.
async function sample(ev) {
  ev.preventDefault();
  const out = $("#pg-out");
  out.textContent = "…";
  try {
    const res = await call("POST", "/v1/completions", {
      model: $("#pg-model").value, prompt: $("#pg-prompt").value,
      max_tokens: Number($("#pg-max").value), temperature: Number($("#pg-temp").value),
    });
    out.textContent = res.choices && res.choices.length ? res.choices[0].text : JSON.stringify(res);
  } catch (e) {
    out.textContent = e.status === 404 ? "This gateway has no /v1/completions endpoint." : e.message;
  }
}

// loadAdmin shows the fleet to admin keys; any other key gets a 403 and the panel stays hidden.
async function loadAdmin() {
  let replicas;
  try { replicas = await api("GET", "skein/replicas"); } catch (e) { $("#admin").hidden = true; return; }
  const capacity = await api("GET", "skein/capacity").catch(() => null);
  const body = $("#admin-body");
  body.replaceChildren();
  for (const [name, data] of [["Replicas and workers", replicas], ["Capacity and queues", capacity]]) {
    if (!data) continue;
    body.appendChild(el("h3", name));
    body.appendChild(table(data));
  }
  $("#admin").hidden = false;
}

// table renders the first array of objects found in data as a table, anything else as JSON.
function table(data) {
  const list = Array.isArray(data) ? data : Object.values(data || {}).find((v) => Array.isArray(v) && v.length && typeof v[0] === "object");
  if (!list || !list.length || typeof list[0] !== "object") return el("pre", JSON.stringify(data, null, 2), { class: "mono" });
  const t = el("table");
  const cols = [...new Set(list.flatMap((o) => Object.keys(o)))];
  const head = el("tr");
  for (const c of cols) head.appendChild(el("th", c));
  t.appendChild(el("thead")).appendChild(head);
  const body = t.appendChild(el("tbody"));
  for (const o of list) body.appendChild(row(cols.map((c) => typeof o[c] === "object" && o[c] !== null ? JSON.stringify(o[c]) : o[c])));
  return t;
}

async function refresh() {
  if (!key()) return;
  status("Loading…");
  try {
    const wasSelected = selectedRun; // else loadRuns selects the newest run itself
    const runs = await loadRuns();
    await Promise.all([loadSessions(), loadPlayground(runs), loadAdmin(), wasSelected ? selectRun(wasSelected) : null]);
    $("#main").hidden = false;
    $("#who").textContent = "key …" + key().slice(-4);
    $("#forget-key").hidden = false;
    status("");
  } catch (e) {
    status(e.message, true);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("#key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("#key-input").value.trim());
    location.reload(); // nothing shown for the previous key survives

  });
  $("#forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    location.reload();
  });
  $("#refresh").addEventListener("click", refresh);
  $("#playground").addEventListener("submit", sample);
  refresh();
});
