// What the monitor derives from two polls, as slotserver top does (top/track.py), kept pure so
// node tests it. Why derive: the engine republishes its stats only after a step that did work,
// so an idle engine's own tokens/s stays frozen; counter deltas between polls are always current.

const PHASES = ["schedule", "moves", "forward", "sample", "postprocess"];

function num(v) { return typeof v === "number" && Number.isFinite(v) ? v : null; }

function counters(engine, now) {
  const steps = num(engine.steps);
  const timings = engine.timings || {};
  const means = PHASES.map((p) => num(timings[p]));
  const total = steps === null || means.includes(null) ? null : means.reduce((a, b) => a + b, 0) * steps;
  return { at: now, predicted: num(engine.predicted_tokens), steps, total };
}

export class Tracker {
  constructor() { this.prev = null; }

  // [tokens per second, mean ms per step] since the previous poll; nulls on the first one.
  rates(engine, nowMs) {
    const cur = counters(engine || {}, nowMs), prev = this.prev;
    this.prev = cur;
    if (!prev || cur.predicted === null || prev.predicted === null || cur.at <= prev.at) return [null, null];
    const dTok = cur.predicted - prev.predicted;
    if (dTok < 0) return [null, null];                 // the server restarted
    const tps = dTok / ((cur.at - prev.at) / 1000);
    let stepMs = 0;
    if (cur.steps !== null && prev.steps !== null && cur.total !== null && prev.total !== null && cur.steps > prev.steps) {
      stepMs = Math.max(0, (cur.total - prev.total) / (cur.steps - prev.steps));
    }
    return [tps, stepMs];
  }
}

export function isActive(slot) { return slot.state === "processing"; }

// Streams 0..n-1 and who holds each (n = max stream + 1, at least slots + 1 with defrag on).
// An idle slot holding no cells is drawn as free: its stream holds nothing worth keeping.
export function streamMap(slots, defrag) {
  const held = new Map();
  for (const s of slots) if (Number.isInteger(s.stream) && s.stream >= 0) held.set(s.stream, s);
  let n = held.size ? Math.max(...held.keys()) + 1 : 0;
  if (defrag === "on") n = Math.max(n, slots.length + 1);
  const cells = [];
  for (let st = 0; st < Math.min(n, 1024); st++) {   // a garbage stream number must not draw forever
    const s = held.get(st);
    const used = s ? (num(s.cells_used) || 0) : 0;
    const kind = !s || (!isActive(s) && used === 0) ? "free" : (isActive(s) ? "active" : "idle");
    cells.push({ stream: st, kind, slot: s ? s.id : null, used, n_ctx: s ? num(s.n_ctx) : null, id_task: s ? s.id_task : null });
  }
  return cells;
}

// Slots whose stream changed since the previous poll (a defrag or a migration moved them).
export function slotMoves(prevStreams, slots) {
  const out = [];
  for (const s of slots) {
    const was = prevStreams[s.id];
    if (Number.isInteger(s.stream) && was !== undefined && was !== s.stream) out.push({ slot: s.id, src: was, dst: s.stream });
  }
  return out.sort((a, b) => a.dst - b.dst);
}

export function streamsOf(slots) {
  const out = {};
  for (const s of slots) if (Number.isInteger(s.stream)) out[s.id] = s.stream;
  return out;
}

export function fmtNum(v, digits = 0) { return num(v) === null ? "?" : v.toFixed(digits); }

export function fmtSize(bytes) {
  if (num(bytes) === null) return "?";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
  return bytes.toFixed(i ? 1 : 0) + " " + units[i];
}

export function baseName(path) { return typeof path === "string" ? path.split("/").pop() : ""; }

// `paged.py:12` for an event, or the file alone when the event points at no line.
export function where(ev) {
  const file = baseName(ev.file);
  const line = Number.parseInt(ev.line, 10);
  return file && line > 0 ? file + ":" + line : file;
}
