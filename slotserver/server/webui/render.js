// Pure functions of the page, with no DOM access at load, so node can test them
// (tests/webui_render.test.mjs): markdown -> a tree of plain objects -> DOM nodes, SSE parsing,
// and folding streamed chat deltas into a message.
//
// Why a tree first: model text must never become HTML. The parser only ever produces nodes from
// a fixed set of tags, with the model's text in {text} leaves; toDom builds them with
// createElement/createTextNode, so `<script>` in an answer can only ever be text.

export const TAGS = new Set(["p", "pre", "code", "strong", "em", "ul", "ol", "li", "h1", "h2", "h3",
  "h4", "h5", "h6", "blockquote"]);

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+.#-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*)$/;
const ITEM = /^\s{0,3}([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;

function text(s) { return { text: s }; }
function el(tag, children, extra) { return Object.assign({ tag, children }, extra || {}); }

// Inline spans: `code`, **bold**, *italic*, _italic_. Anything else (links, HTML) stays text.
const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|\*(?=[^\s*])([^*]*?[^\s*])\*|\b_(?=\S)([^_]*?\S)_\b/;

export function parseInline(s) {
  const out = [];
  while (s.length) {
    const m = INLINE.exec(s);
    if (!m) { out.push(text(s)); break; }
    if (m.index > 0) out.push(text(s.slice(0, m.index)));
    if (m[1] !== undefined) out.push(el("code", [text(m[2])]));
    else if (m[3] !== undefined) out.push(el("strong", parseInline(m[3])));
    else out.push(el("em", parseInline(m[4] !== undefined ? m[4] : m[5])));
    s = s.slice(m.index + m[0].length);
  }
  return out;
}

// A fenced block runs to its closing fence, or to the end of the text: while an answer streams,
// an open fence is already shown as code.
function readFence(lines, i, m) {
  const body = [];
  let j = i + 1;
  const close = new RegExp("^\\s{0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
  while (j < lines.length && !close.test(lines[j])) body.push(lines[j++]);
  const code = el("code", [text(body.join("\n"))], m[2] ? { lang: m[2] } : undefined);
  return [el("pre", [code]), j + 1];
}

function readList(lines, i) {
  const ordered = /\d/.test(ITEM.exec(lines[i])[1]);
  const items = [];
  let j = i;
  while (j < lines.length) {
    const m = ITEM.exec(lines[j]);
    if (m && /\d/.test(m[1]) === ordered) { items.push(m[2]); j++; }
    else if (items.length && /^\s{2,}\S/.test(lines[j])) { items[items.length - 1] += "\n" + lines[j].trim(); j++; }
    else break;
  }
  return [el(ordered ? "ol" : "ul", items.map((s) => el("li", parseInline(s)))), j];
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || ITEM.test(line) || QUOTE.test(line);
}

export function parseMarkdown(src) {
  const lines = String(src).replace(/\r\n?/g, "\n").split("\n");
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) { i++; continue; }
    if ((m = FENCE.exec(line))) { const [b, j] = readFence(lines, i, m); blocks.push(b); i = j; continue; }
    if ((m = HEADING.exec(line))) { blocks.push(el("h" + m[1].length, parseInline(m[2]))); i++; continue; }
    if (ITEM.test(line)) { const [b, j] = readList(lines, i); blocks.push(b); i = j; continue; }
    if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { quoted.push(m[1]); i++; }
      blocks.push(el("blockquote", parseMarkdown(quoted.join("\n"))));
      continue;
    }
    const para = [line];
    i++;
    while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) para.push(lines[i++]);
    blocks.push(el("p", parseInline(para.join("\n"))));
  }
  return blocks;
}

// Tree -> DOM. `doc` is the document (or node's fake in the tests). An unknown tag is an error,
// not a pass-through: the tree comes from parseMarkdown, and anything else is a bug.
export function toDom(nodes, doc) {
  const frag = doc.createDocumentFragment();
  for (const node of nodes) frag.appendChild(nodeToDom(node, doc));
  return frag;
}

function nodeToDom(node, doc) {
  if (node.text !== undefined) return doc.createTextNode(String(node.text));
  if (!TAGS.has(node.tag)) throw new Error("render: tag not allowed: " + node.tag);
  const e = doc.createElement(node.tag);
  if (node.lang) e.className = "lang-" + node.lang.replace(/[^\w-]/g, "");
  for (const child of node.children) e.appendChild(nodeToDom(child, doc));
  return e;
}

// For the few places that build strings (titles, logs): the five HTML metacharacters escaped.
export function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// Control characters out of server strings shown in one-line cells (as slotserver top's clean()).
export function clean(s, limit = 2000) {
  return String(s).slice(0, limit).replace(/[\u0000-\u001f\u007f-\u009f]/g, "\ufffd");
}

// Server-sent events, fed with decoded text chunks that may end anywhere (mid-line, mid-event).
export class SseParser {
  constructor() { this.buf = ""; this.data = []; this.event = ""; }

  feed(chunk) {
    this.buf += chunk;
    const out = [];
    let nl;
    while ((nl = this.buf.indexOf("\n")) >= 0) {
      let line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      const ev = this.line(line);
      if (ev) out.push(ev);
    }
    return out;
  }

  line(line) {
    if (line === "") {
      if (!this.data.length) { this.event = ""; return null; }
      const ev = { event: this.event || "message", data: this.data.join("\n") };
      this.data = []; this.event = "";
      return ev;
    }
    if (line.startsWith(":")) return null;          // a comment: keep-alive
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    return null;
  }
}

// One OpenAI chat chunk's delta folded into a message {content, reasoning, tool_calls}.
export function applyDelta(msg, delta) {
  if (!delta) return msg;
  if (typeof delta.content === "string") msg.content += delta.content;
  if (typeof delta.reasoning_content === "string") msg.reasoning = (msg.reasoning || "") + delta.reasoning_content;
  for (const tc of Array.isArray(delta.tool_calls) ? delta.tool_calls : []) {
    msg.tool_calls = msg.tool_calls || [];
    const idx = Number.isInteger(tc.index) ? tc.index : msg.tool_calls.length;
    const call = msg.tool_calls[idx] || (msg.tool_calls[idx] = { id: "", name: "", arguments: "" });
    if (tc.id) call.id = tc.id;
    if (tc.function && typeof tc.function.name === "string") call.name += tc.function.name;
    if (tc.function && typeof tc.function.arguments === "string") call.arguments += tc.function.arguments;
  }
  return msg;
}
