// Node checks of the web page's pure functions (run by tests/test_webui.py).
// Usage: node webui_render.test.mjs DIR, where DIR holds render.mjs and monitor_model.mjs (copies
// of slotserver/server/webui/*.js: node reads a .js file outside a "type": "module" package as
// CommonJS). Prints "ok N" and exits 0, or throws.
import assert from "node:assert/strict";
import { pathToFileURL } from "node:url";
import path from "node:path";

const dir = process.argv[2];
const R = await import(pathToFileURL(path.join(dir, "render.mjs")).href);
const M = await import(pathToFileURL(path.join(dir, "monitor_model.mjs")).href);

// A fake document: enough of the DOM for toDom, recording what was made.
function fakeDoc() {
  const made = [];
  const mk = (tagName) => {
    const node = { tagName, nodeType: 1, childNodes: [], className: "",
      appendChild(c) { this.childNodes.push(c); return c; } };
    made.push(node);
    return node;
  };
  return {
    made,
    createElement: (t) => mk(t.toUpperCase()),
    createDocumentFragment: () => mk("#fragment"),
    createTextNode: (s) => ({ nodeType: 3, data: s }),
  };
}
const allText = (n) => n.nodeType === 3 ? n.data : n.childNodes.map(allText).join("");
const tags = (doc) => doc.made.map((n) => n.tagName);

let n = 0;
function test(name, fn) { fn(); n++; }

test("script and img in an answer are text only", () => {
  const answer = "Hi <script>alert(1)</script> and <img src=x onerror=alert(2)>\n\n**<b>x</b>** `<svg onload=1>`";
  const doc = fakeDoc();
  const frag = R.toDom(R.parseMarkdown(answer), doc);
  for (const t of tags(doc)) assert.ok(!["SCRIPT", "IMG", "SVG", "B"].includes(t), t);
  const txt = allText(frag);
  assert.ok(txt.includes("<script>alert(1)</script>"));
  assert.ok(txt.includes("<img src=x onerror=alert(2)>"));
  assert.ok(txt.includes("<svg onload=1>"));
});

test("a tree with a foreign tag is refused", () => {
  assert.throws(() => R.toDom([{ tag: "script", children: [] }], fakeDoc()), /not allowed/);
});

test("code fences become pre>code, open fences too", () => {
  const tree = R.parseMarkdown("Look:\n```python\nprint('<b>')\n```\nafter");
  assert.deepEqual(tree.map((b) => b.tag), ["p", "pre", "p"]);
  assert.equal(tree[1].children[0].tag, "code");
  assert.equal(tree[1].children[0].lang, "python");
  assert.equal(tree[1].children[0].children[0].text, "print('<b>')");
  const open = R.parseMarkdown("```\nstill streaming");
  assert.equal(open[0].tag, "pre");
  assert.equal(open[0].children[0].children[0].text, "still streaming");
});

test("inline code, bold, italic, lists, headings", () => {
  const [p] = R.parseMarkdown("a `x*y*` **b** *c* _d_");
  assert.deepEqual(p.children.map((c) => c.tag || "t"), ["t", "code", "t", "strong", "t", "em", "t", "em"]);
  assert.equal(p.children[1].children[0].text, "x*y*");
  const blocks = R.parseMarkdown("# T\n- one\n- two\n\n1. a\n2. b");
  assert.deepEqual(blocks.map((b) => b.tag), ["h1", "ul", "ol"]);
  assert.equal(blocks[1].children.length, 2);
});

test("escapeHtml and clean", () => {
  assert.equal(R.escapeHtml(`<a href="x">'&'</a>`), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  assert.equal(R.clean("a\u001b[2Jb\nc"), "a\ufffd[2Jb\ufffdc");
});

test("SSE parser handles chunks split anywhere", () => {
  const body = 'data: {"a":1}\n\n: keep-alive\n\nevent: x\ndata: l1\ndata: l2\r\n\r\ndata: [DONE]\n\n';
  const whole = new R.SseParser().feed(body);
  assert.deepEqual(whole, [{ event: "message", data: '{"a":1}' }, { event: "x", data: "l1\nl2" },
    { event: "message", data: "[DONE]" }]);
  for (let size = 1; size < 8; size++) {
    const p = new R.SseParser();
    const got = [];
    for (let i = 0; i < body.length; i += size) got.push(...p.feed(body.slice(i, i + size)));
    assert.deepEqual(got, whole, "chunk size " + size);
  }
});

test("deltas fold into content, reasoning and tool calls", () => {
  const m = { content: "" };
  R.applyDelta(m, { reasoning_content: "think" });
  R.applyDelta(m, { content: "Hel" });
  R.applyDelta(m, { content: "lo" });
  R.applyDelta(m, { tool_calls: [{ index: 0, id: "c1", function: { name: "get", arguments: '{"a"' } }] });
  R.applyDelta(m, { tool_calls: [{ index: 0, function: { arguments: ":1}" } }] });
  assert.equal(m.content, "Hello");
  assert.equal(m.reasoning, "think");
  assert.deepEqual(m.tool_calls, [{ id: "c1", name: "get", arguments: '{"a":1}' }]);
});

test("stream map: holders, idle caches and free gaps", () => {
  const slots = [{ id: 0, stream: 2, state: "processing", cells_used: 10, n_ctx: 64 },
    { id: 1, stream: 0, state: "idle", cells_used: 5, n_ctx: 64 },
    { id: 2, stream: 1, state: "idle", cells_used: 0, n_ctx: 64 }];
  const map = M.streamMap(slots, "on");
  assert.deepEqual(map.map((c) => c.kind), ["idle", "free", "active", "free"]);
  assert.equal(map[2].slot, 0);
  assert.deepEqual(M.slotMoves({ 0: 1 }, slots), [{ slot: 0, src: 1, dst: 2 }]);
});

test("rates from counter deltas", () => {
  const t = new M.Tracker();
  const eng = (p, s, f) => ({ predicted_tokens: p, steps: s, timings: { schedule: 0, moves: 0, forward: f, sample: 0, postprocess: 0 } });
  assert.deepEqual(t.rates(eng(0, 0, 0), 0), [null, null]);
  const [tps, ms] = t.rates(eng(10, 10, 2), 1000);
  assert.equal(tps, 10);
  assert.equal(ms, 2);
});

console.log("ok " + n);
