// The monitor view: polls /slots, /lab and /props every POLL_MS while shown and draws what
// `slotserver top` draws: header, slots with context bars, the KV stream map with defrag moves,
// tokens/s and step-time charts, kernels, the lab event log; plus the lab's two verbs.
import { getJson, postJson } from "./api.js";
import { Ring, drawSpark } from "./charts.js";
import * as M from "./monitor_model.js";
import { clean } from "./render.js";

const POLL_MS = 500;
const $ = (id) => document.getElementById(id);

const tracker = new M.Tracker();
const tps = new Ring(120), stepMs = new Ring(120);
let timer = null, prevStreams = {}, lastMove = null, props = null, layoutsShown = "";

function cell(tag, text, cls) {
  const e = document.createElement(tag);
  e.textContent = clean(text === null || text === undefined ? "" : String(text), 400);
  if (cls) e.className = cls;
  return e;
}

function row(values, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const v of values) tr.appendChild(v instanceof Node ? wrapTd(v) : cell("td", v));
  return tr;
}

function wrapTd(child) { const td = document.createElement("td"); td.appendChild(child); return td; }

// A context bar: a <progress> (no inline style needed) and "used/ctx".
function bar(used, total, kind) {
  const span = document.createElement("span");
  span.className = "bar " + (kind || "");
  const p = document.createElement("progress");
  p.max = total > 0 ? total : 1;
  p.value = Math.min(used || 0, p.max);
  span.append(p, cell("span", " " + (used ?? "?") + "/" + (total ?? "?")));
  return span;
}

function header(lab, engine) {
  const layout = lab.layout || {};
  const p = props || {};
  const parts = [["model", M.baseName(p.model_alias || p.model_path || "?")], ["dtype", p.dtype || "?"],
    ["device", p.device || lab.device || "?"], ["layout", (layout.name || engine.layout || "?") + (layout.kv_type ? " · " + layout.kv_type : "")],
    ["v", (layout.version || "?").slice(0, 8)], ["tok/s", M.fmtNum(tps.last(), 1)], ["queue", engine.queue_len ?? "?"],
    ["active", (engine.n_active ?? "?") + "/" + (engine.slots || []).length], ["kv", M.fmtSize(layout.bytes ?? engine.kv_bytes)],
    ["steps", engine.steps ?? "?"]];
  $("mon-header").replaceChildren(...parts.map(([k, v]) => {
    const s = cell("span", "", "kv");
    s.append(cell("span", k + " ", "k"), cell("b", v));
    return s;
  }));
}

function slotsTable(slots) {
  $("slots-body").replaceChildren(...slots.map((s) => {
    const gen = s.next_token && s.next_token[0] ? s.next_token[0].n_decoded : s.n_generated;
    return row([s.id, s.state, s.stream, s.id_task >= 0 ? s.id_task : "", s.n_prompt, s.n_cached, gen,
      M.fmtNum(s.tokens_per_second, 1), bar(s.cells_used, s.n_ctx, M.isActive(s) ? "active" : "idle")], "state-" + s.state);
  }));
}

function streamsView(slots, engine, now) {
  const moves = M.slotMoves(prevStreams, slots);
  prevStreams = M.streamsOf(slots);
  if (moves.length) lastMove = { at: now, moves };
  $("streams-body").replaceChildren(...M.streamMap(slots, engine.defrag).map((c) => {
    const what = c.kind === "free" ? (c.slot === null ? "free" : "free (slot " + c.slot + ", empty)")
      : "slot " + c.slot + (c.kind === "active" ? " processing" + (c.id_task >= 0 ? " task " + c.id_task : "") : " idle, cached");
    // a stream no slot holds has no size to show: a dotted gap instead of an empty bar
    const fill = c.slot === null ? cell("span", "· · · · · · · ·", "gap") : bar(c.used, c.n_ctx || 1, c.kind);
    return row(["s" + c.stream, fill, what], "stream-" + c.kind);
  }));
  let text = "defrag " + (engine.defrag || "?") + " · copies " + (engine.defrag_moves ?? "?") + " (" + M.fmtSize(engine.defrag_bytes) + ")";
  if (lastMove) {
    text += " · last move " + ((now - lastMove.at) / 1000).toFixed(0) + " s ago: "
      + lastMove.moves.map((m) => "slot " + m.slot + " s" + m.src + "→s" + m.dst).join(", ");
  }
  $("defrag").textContent = text;
}

function charts() {
  drawSpark($("chart-tps"), tps.values, "#2e9e5b");
  drawSpark($("chart-step"), stepMs.values, "#9b59b6");
  $("tps-now").textContent = M.fmtNum(tps.last(), 1) + " tok/s (max " + M.fmtNum(tps.max(), 1) + ")";
  $("step-now").textContent = M.fmtNum(stepMs.last(), 2) + " ms/step (max " + M.fmtNum(stepMs.max(), 2) + ")";
}

function kernelsTable(lab) {
  const last = {};
  for (const e of lab.events || []) if (e.kind === "kernel" && e.name) last[e.name] = e;   // oldest first: newest wins
  $("kernels-body").replaceChildren(...(lab.kernels || []).map((k) => {
    const ev = last[k.op];
    const check = ev ? ev.result + (ev.result !== "swapped" && ev.reason ? " " + ev.reason : "") : "-";
    return row([k.op, k.impl, k.version, M.fmtNum(k.mean_ms, 3), k.calls, k.path || "-", check], ev ? "result-" + ev.result : "");
  }));
}

function eventsTable(lab) {
  const events = (lab.events || []).slice().reverse();
  $("events-body").replaceChildren(...events.map((e) => row([e.seq, new Date((e.time || 0) * 1000).toLocaleTimeString(),
    e.result, e.kind, e.name, M.where(e), e.version ? String(e.version).slice(0, 8) : "",
    M.fmtNum(e.latency_ms, 0) + " ms", e.reason || ""], "result-" + e.result)));
}

function layoutChoices(lab) {
  const names = (lab.layouts || []).map((x) => (typeof x === "string" ? x : x && x.name)).filter(Boolean);
  const key = names.join(",") + "|" + ((lab.layout || {}).name || "");
  if (key === layoutsShown) return;   // rebuilding the <select> each poll would close it under the mouse
  layoutsShown = key;
  $("layout-select").replaceChildren(...names.map((n) => {
    const o = cell("option", n);
    o.value = n;
    o.selected = n === (lab.layout || {}).name;
    return o;
  }));
}

async function poll() {
  const now = Date.now();
  try {
    // /slots may be off (--no-slots: 501); the lab's engine section has the same slots then
    const [slotsAnswer, lab, p] = await Promise.all([getJson("/slots").catch((e) => (e.status === 501 ? null : Promise.reject(e))),
      getJson("/lab"), props ? props : getJson("/props")]);
    props = p;
    const engine = lab.engine || {};
    const slots = Array.isArray(slotsAnswer) ? slotsAnswer : (engine.slots || []);
    const [t, s] = tracker.rates(engine, now);
    if (t !== null) { tps.push(t); stepMs.push(s || 0); }
    header(lab, engine);
    slotsTable(slots);
    streamsView(slots, engine, now);
    charts();
    kernelsTable(lab);
    eventsTable(lab);
    layoutChoices(lab);
    $("mon-status").textContent = "● live";
    $("mon-status").className = "status ok";
  } catch (e) {
    props = null;
    $("mon-status").textContent = "⟳ " + (e.message || e);
    $("mon-status").className = "status bad";
  }
}

async function act(what, path, body) {
  $("lab-result").textContent = what + "…";
  try {
    const r = await postJson(path, body);
    $("lab-result").textContent = what + ": " + (r.result || "done") + (r.version ? " (" + String(r.version).slice(0, 8) + ")" : "");
  } catch (e) {
    $("lab-result").textContent = what + " failed: " + (e.message || e);
  }
  layoutsShown = "";
  poll();
}

export function startMonitor() {
  if (timer) return;
  poll();
  timer = setInterval(poll, POLL_MS);
}

export function stopMonitor() { clearInterval(timer); timer = null; }

export function initMonitor() {
  $("layout-switch").addEventListener("click", () => {
    const name = $("layout-select").value;
    if (name) act("layout " + name, "/lab/layout", { layout: name });
  });
  $("lab-reload").addEventListener("click", () => act("reload", "/lab/reload", {}));
}
