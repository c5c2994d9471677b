// Sparklines drawn on <canvas> (no inline styles or SVG markup strings: CSP-friendly).

// Points of a sparkline for `values` in a w x h box, scaled to the largest value (at least `floor`).
export function sparkPoints(values, w, h, floor = 1e-9) {
  const max = Math.max(floor, ...values.filter((v) => Number.isFinite(v)));
  const step = values.length > 1 ? w / (values.length - 1) : 0;
  return values.map((v, i) => [i * step, h - 2 - (Number.isFinite(v) ? v / max : 0) * (h - 4)]);
}

export function drawSpark(canvas, values, color) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 300, h = canvas.clientHeight || 40;
  if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  if (!values.length) return;
  const pts = sparkPoints(values, w, h);
  ctx.beginPath();
  pts.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.stroke();
  ctx.lineTo(pts[pts.length - 1][0], h);
  ctx.lineTo(0, h);
  ctx.closePath();
  ctx.globalAlpha = 0.15;
  ctx.fillStyle = color;
  ctx.fill();
  ctx.globalAlpha = 1;
}

// A fixed-length history: the last `n` values.
export class Ring {
  constructor(n) { this.n = n; this.values = []; }
  push(v) { this.values.push(v); if (this.values.length > this.n) this.values.shift(); }
  last() { return this.values.length ? this.values[this.values.length - 1] : null; }
  max() { return this.values.length ? Math.max(...this.values) : null; }
}
