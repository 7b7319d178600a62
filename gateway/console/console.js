// The skein console: plain JavaScript over the same REST API every client uses. The API key is
// kept in sessionStorage (this tab only) and sent as X-API-Key; it never goes into a URL. Every
// value from the API is written with textContent, never as HTML.
"use strict";

const KEY = "skein.apiKey";
const SVG = "http://www.w3.org/2000/svg";
const $ = (sel) => document.querySelector(sel);

let selectedRun = null;
let whoami = null;                          // GET /api/v1/console/whoami: what this key may see
let metrics = { run: null, steps: [] };    // the selected run's steps so far: polls fetch only newer ones
const shown = new Map();                    // table id -> signature of what it shows, so a poll redraws only changes
const POLL_MS = 3000;                       // live view: how often the page re-reads the API while visible

function key() { return sessionStorage.getItem(KEY) || ""; }

// api calls the gateway's REST API under /api/v1/ and returns the decoded JSON body.
async function api(method, path, body) {
  return call(method, "/api/v1/" + path, body);
}

async function call(method, url, body, extraHeaders) {
  const headers = Object.assign({ "X-API-Key": key() }, extraHeaders || {});
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

// statusSeq counts status messages, so that a refresh clears only its own "Loading…" and not a
// message (a refused TTL, say) written while it ran.
let statusSeq = 0;
function status(msg, isError) {
  statusSeq++;
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

// changed records what a table now shows and says whether it differs from what it showed: a poll
// every few seconds must not rebuild rows (and the buttons under the user's pointer) for nothing.
function changed(id, data) {
  const sig = JSON.stringify(data);
  if (shown.get(id) === sig) return false;
  shown.set(id, sig);
  return true;
}

function fmtAgo(t) {
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  return s < 90 ? Math.round(s) + " s" : s < 5400 ? Math.round(s / 60) + " min" : (s / 3600).toFixed(1) + " h";
}

// runState words the API's state: running (with what waits behind it), idle since the last request, or expired.
function runState(r) {
  if (r.state === "running") return "running" + (r.queued_ops ? " (" + r.queued_ops + " queued)" : "") + ", last request " + fmtAgo(r.last_request_time) + " ago";
  if (r.state === "idle") return "idle for " + fmtAgo(r.last_request_time);
  return r.state || "?";
}

async function loadRuns() {
  const data = await api("GET", "training_runs?limit=1000&include=state");
  const runs = data.training_runs || [];
  const body = $("#runs tbody");
  // The idle time moves every poll; its minute resolution is enough to redraw on.
  if (changed("runs", [selectedRun, runs.map((r) => [r, runState(r)])])) {
    body.replaceChildren();
    for (const r of runs) {
      const tr = row([el("code", r.training_run_id), r.base_model, r.lora_rank, r.step, runState(r),
        ckptName(r.last_checkpoint), ckptName(r.last_sampler_checkpoint), fmtTime(r.last_request_time)]);
      tr.children[3].className = "step";
      tr.children[4].className = "state";
      tr.className = "run" + (r.training_run_id === selectedRun ? " selected" : "");
      tr.dataset.run = r.training_run_id;
      tr.addEventListener("click", () => selectRun(r.training_run_id));
      body.appendChild(tr);
    }
    if (runs.length === 0) body.appendChild(row(["No training runs yet."]));
  }
  if (!selectedRun && runs.length > 0) await selectRun(runs[runs.length - 1].training_run_id);
  return runs;
}

async function selectRun(id) {
  selectedRun = id;
  for (const tr of document.querySelectorAll("#runs tr.run")) tr.classList.toggle("selected", tr.dataset.run === id);
  $("#run-detail").hidden = false;
  $("#run-id").textContent = id;
  shown.delete("checkpoints");
  await Promise.all([loadMetrics(id), loadCheckpoints(id)]);
}

// loadMetrics fetches the run's steps after those already shown (all of them for a newly
// selected run) and redraws the charts when there are new ones.
async function loadMetrics(id) {
  if (metrics.run !== id) metrics = { run: id, steps: [] };
  const fresh = [];
  let after = metrics.steps.length ? metrics.steps[metrics.steps.length - 1].step : 0;
  for (let page = 0; page < 10; page++) {
    const data = await api("GET", "training_runs/" + encodeURIComponent(id) + "/metrics?after_step=" + after);
    fresh.push(...data.steps);
    if (!data.has_more || data.steps.length === 0) break;
    after = data.steps[data.steps.length - 1].step;
  }
  if (metrics.run !== id) return; // another run was selected meanwhile
  metrics.steps.push(...fresh);
  if (fresh.length || !$("#chart-loss")) drawCharts();
}

function drawCharts() {
  const steps = metrics.steps;
  const charts = $("#charts");
  charts.replaceChildren();
  charts.appendChild(chart("loss", "loss (mean per token)", "loss", steps.filter((s) => s.loss !== undefined && s.loss !== null).map((s) => [s.step, s.loss]), $("#loss-log").checked));
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
  for (const [name, points] of series) charts.appendChild(chart("m" + i++, name, name.split(" ").pop(), points, false));
}

// chart draws points [[step, value], …] as an SVG line with one circle per step, its axes
// labelled; log draws values on a log scale (positive ones only: a log axis has no place for the rest).
function chart(id, title, yLabel, points, log) {
  const W = 420, H = 220, L = 60, R = 12, T = 22, B = 40;
  if (log) points = points.filter((p) => p[1] > 0);
  const s = svg("svg", { id: "chart-" + id, class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`,
    "data-points": points.length, "data-scale": log ? "log" : "linear" });
  s.appendChild(svg("text", { x: L, y: 14, class: "title" }, title));
  s.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
  s.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
  s.appendChild(svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "axis-label" }, "step"));
  s.appendChild(svg("text", { x: 12, y: (T + H - B) / 2, "text-anchor": "middle", class: "axis-label",
    transform: `rotate(-90 12 ${(T + H - B) / 2})` }, yLabel + (log ? " (log)" : "")));
  if (points.length === 0) {
    s.appendChild(svg("text", { x: L + 10, y: H / 2 }, "no steps yet"));
    return s;
  }
  const f = log ? Math.log10 : (v) => v;
  const xs = points.map((p) => p[0]), ys = points.map((p) => f(p[1]));
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  s.appendChild(svg("polyline", { class: "line", points: points.map((p, i) => px(p[0]).toFixed(1) + "," + py(ys[i]).toFixed(1)).join(" ") }));
  points.forEach(([x, y], i) => {
    const c = svg("circle", { cx: px(x).toFixed(1), cy: py(ys[i]).toFixed(1), r: points.length > 200 ? 1 : 2.5, "data-step": x });
    c.appendChild(svg("title", {}, "step " + x + ": " + y.toPrecision(5)));
    s.appendChild(c);
  });
  const tick = (v) => (log ? Math.pow(10, v) : v).toPrecision(3);
  s.appendChild(svg("text", { x: L - 4, y: T + 4, "text-anchor": "end" }, tick(y1)));
  s.appendChild(svg("text", { x: L - 4, y: H - B, "text-anchor": "end" }, tick(y0)));
  s.appendChild(svg("text", { x: L, y: H - B + 14 }, String(xs[0])));
  s.appendChild(svg("text", { x: W - R, y: H - B + 14, "text-anchor": "end" }, String(xs[xs.length - 1])));
  return s;
}

// parseTTL reads "2h", "30m", "90s", "1d" or plain seconds; empty means never expire (null).
// Anything else is an error: a typo must not be sent as null and so remove the TTL.
function parseTTL(text) {
  const v = text.trim();
  if (v === "") return null;
  const m = /^(\d+)\s*([smhd]?)$/i.exec(v);
  if (!m) throw new Error("\u201c" + v + "\u201d is not a TTL: write e.g. 2h, 30m, 90s or a number of seconds (empty: never expire)");
  const n = Number(m[1]) * { "": 1, s: 1, m: 60, h: 3600, d: 86400 }[m[2].toLowerCase()];
  if (!Number.isSafeInteger(n)) throw new Error("\u201c" + v + "\u201d is too long a TTL");
  return n;
}

// download asks for the archive's signed URL as JSON (else the API answers with a redirect and
// fetch would follow it, reading the whole archive) and lets the browser download from it.
async function download(p) {
  const res = await call("GET", "/api/v1/" + p + "/archive", undefined, { Accept: "application/json" });
  if (!res || !res.url) throw new Error("the server gave no download URL");
  if (!/^https?:$/.test(new URL(res.url, location.href).protocol)) throw new Error("the server gave a download URL that is not http(s)");
  const a = el("a", null, { href: res.url, download: "" });
  document.body.appendChild(a);
  a.click();
  a.remove();
}

function actionButton(action, label, onclick) {
  const b = button(label, onclick);
  b.dataset.action = action;
  return b;
}

async function loadCheckpoints(id) {
  const data = await api("GET", "training_runs/" + encodeURIComponent(id) + "/checkpoints");
  const list = data.checkpoints || [];
  if (!changed("checkpoints", [id, list])) return;
  const body = $("#checkpoints tbody");
  body.replaceChildren();
  const base = "training_runs/" + encodeURIComponent(id) + "/checkpoints/";
  for (const c of list) {
    const p = base + kindAndName(c.tinker_path);
    const actions = el("span");
    actions.append(
      actionButton("publish", c.public ? "Unpublish" : "Publish", () => act(api(c.public ? "DELETE" : "POST", p + "/publish"))),
      actionButton("ttl", "TTL", () => {
        const v = prompt("Expire after? e.g. 2h, 30m, 90s or seconds (empty: never)", "");
        if (v === null) return;
        let ttl;
        try { ttl = parseTTL(v); } catch (e) { status(e.message, true); return; }
        act(api("PUT", p + "/ttl", { ttl_seconds: ttl }));
      }),
      actionButton("download", "Download", async () => {
        try { await download(p); status(""); } catch (e) { status(e.message, true); }
      }),
      actionButton("delete", "Delete", () => { if (confirm("Delete " + c.tinker_path + "?")) act(api("DELETE", p)); }),
    );
    body.appendChild(row([el("code", ckptName(c)), c.checkpoint_type, fmtTime(c.time), fmtBytes(c.size_bytes),
      c.public ? "yes" : "no", c.expires_at ? fmtTime(c.expires_at) : "never", actions]));
    body.lastChild.firstChild.title = c.tinker_path;
  }
  if (list.length === 0) body.appendChild(row(["No checkpoints."]));
}

// act awaits an action and the refresh after it. body[data-pending] counts the actions still
// in flight (the status line cannot say: a refresh writes "Loading…" only once its action's
// request has answered), so that scripts driving the page know when it has settled.
let pendingActs = 0;
async function act(p) {
  document.body.dataset.pending = String(++pendingActs);
  try { await p; await refresh(); } catch (e) { status(e.message, true); } finally {
    document.body.dataset.pending = String(--pendingActs);
  }
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

// loadPlayground lists what the completions endpoint can sample: every base model and every
// sampler checkpoint of this key (GET /v1/models, the endpoint's own list).
async function loadPlayground() {
  const data = await call("GET", "/v1/models");
  const models = (data && data.data) || [];
  if (!changed("playground", models)) return;
  const sel = $("#pg-model");
  const keep = sel.value;
  sel.replaceChildren();
  for (const m of models) {
    const value = m.root || m.id; // a checkpoint by its tinker:// path, a base model by name
    sel.appendChild(el("option", m.root ? m.id + " (" + m.root + ")" : m.id + " (base model)", { value }));
  }
  if (models.length === 0) sel.appendChild(el("option", "no models", { value: "" }));
  if (keep && [...sel.options].some((o) => o.value === keep)) sel.value = keep;
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
    out.textContent = res && res.choices && res.choices.length ? res.choices[0].text : "(the server returned no completion)";
  } catch (e) {
    out.textContent = e.message; // the server's own words, e.g. "404: The model `x` does not exist…"
  }
}

// loadAdmin shows the fleet only to a key the server says may read it (whoami), so a tenant's
// console neither shows the panel nor probes the fleet endpoints.
async function loadAdmin() {
  if (!whoami || !whoami.admin) { $("#admin").hidden = true; return; }
  const [replicas, capacity] = await Promise.all([api("GET", "skein/replicas"), api("GET", "skein/capacity").catch(() => null)]);
  if (!changed("admin", [replicas, capacity])) return;
  const body = $("#admin-body");
  body.replaceChildren();
  if (whoami.auth === "open") body.appendChild(el("p", "Open mode: every caller of this gateway can read the fleet; start it with --auth keys to limit this to admin keys.", { class: "note" }));
  for (const [name, data] of [["Replicas and workers", replicas], ["Capacity", capacity]]) {
    if (!data) continue;
    body.appendChild(el("h3", name));
    body.appendChild(table(data));
  }
  $("#admin").hidden = false;
}

// table renders a list of objects (or a map of name to object) as a table. A nested object
// becomes "key: value" lines in its cell and a list of values a comma-separated one: no raw JSON.
function table(data) {
  let list = Array.isArray(data) ? data : Object.values(data || {}).find((v) => Array.isArray(v));
  if (!list) {
    // A map of name -> object (capacity per base model), else one object: a row each.
    const entries = Object.entries(data || {});
    list = entries.length && entries.every(([, v]) => v && typeof v === "object" && !Array.isArray(v))
      ? entries.map(([k, v]) => Object.assign({ name: k }, v)) : [data || {}];
  }
  const t = el("table", null, { class: "fleet" });
  const cols = [...new Set(list.flatMap((o) => (o && typeof o === "object" ? Object.keys(o) : [])))];
  const head = el("tr");
  for (const c of cols) head.appendChild(el("th", c.replace(/_/g, " "))); // words that can wrap: the table fits 800 px
  t.appendChild(el("thead")).appendChild(head);
  const body = t.appendChild(el("tbody"));
  for (const o of list) body.appendChild(row(cols.map((c) => cell(o ? o[c] : undefined))));
  if (list.length === 0) body.appendChild(row(["none"]));
  return wrap(t);
}

function cell(v) {
  if (v === null || v === undefined) return "";
  if (Array.isArray(v)) return v.length === 0 ? "none" : v.map((x) => (x && typeof x === "object" ? cell(x) : String(x))).join(", ");
  if (typeof v === "object") return Object.entries(v).map(([k, x]) => k.replace(/_/g, " ") + ": " + cell(x)).join("\n");
  if (typeof v === "boolean") return v ? "yes" : "no";
  return String(v);
}

// wrap lets a table scroll on its own if it still cannot fit, never the page.
function wrap(t) {
  const d = el("div", null, { class: "scroll" });
  d.appendChild(t);
  return d;
}

async function refresh() {
  if (!key()) return;
  status("Loading…");
  const mine = statusSeq;
  try {
    whoami = await api("GET", "console/whoami");
    shown.clear(); // a full refresh redraws everything
    const wasSelected = selectedRun; // else loadRuns selects the newest run itself
    await loadRuns();
    await Promise.all([loadSessions(), loadPlayground(), loadAdmin(), wasSelected ? selectRun(wasSelected) : null]);
    $("#main").hidden = false;
    $("#who").textContent = "key …" + key().slice(-4) + (whoami.admin ? " (admin)" : "");
    $("#forget-key").hidden = false;
    $("#key-hint").hidden = true; // a key works: the hint on which key to enter is done
    if (statusSeq === mine) status("");
  } catch (e) {
    status(e.message, true);
  }
}

// tick is the live view: while the tab is visible it re-reads the runs, the selected run's new
// steps and checkpoints, and the playground's models, and redraws what changed. A failed poll
// says so in the status line; the next good one clears that (and nothing the user was told).
let ticking = false, pollFailed = false;
async function tick() {
  if (ticking || document.hidden || !key() || $("#main").hidden) return;
  ticking = true;
  try {
    await loadRuns();
    await Promise.all([selectedRun ? loadMetrics(selectedRun) : null, selectedRun ? loadCheckpoints(selectedRun) : null, loadPlayground()]);
    if (pollFailed && $("#status").textContent.startsWith("live update: ")) status("");
    pollFailed = false;
  } catch (e) {
    status("live update: " + e.message, true);
    pollFailed = true;
  } finally {
    ticking = false;
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
  $("#loss-log").addEventListener("change", drawCharts);
  setInterval(tick, POLL_MS);
  document.addEventListener("visibilitychange", tick); // back in view: catch up at once
  refresh();
});
