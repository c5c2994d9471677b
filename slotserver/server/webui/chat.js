// The chat view: conversations (kept in localStorage), streaming answers with stop and
// regenerate, sampling settings. Model text reaches the page only through render.js's tree.
import { streamChat } from "./api.js";
import { applyDelta, parseMarkdown, toDom } from "./render.js";

const STORE = "slotserver.conversations";
const $ = (id) => document.getElementById(id);

let conversations = [];
let current = null;        // the conversation shown
let controller = null;     // the AbortController of the answer streaming now, if any

function load() {
  try { conversations = JSON.parse(localStorage.getItem(STORE) || "[]"); } catch (_) { conversations = []; }
  if (!Array.isArray(conversations)) conversations = [];
}

function save() { localStorage.setItem(STORE, JSON.stringify(conversations)); }

function newConversation() {
  current = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: "New chat", messages: [] };
  conversations.unshift(current);
  save();
  renderAll();
}

function node(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderList() {
  const list = $("conv-list");
  list.replaceChildren();
  for (const c of conversations) {
    const item = node("li", c === current ? "conv active" : "conv");
    const open = node("button", "conv-open", c.title || "chat");
    open.addEventListener("click", () => { if (!controller) { current = c; renderAll(); } });
    const del = node("button", "conv-del", "×");
    del.title = "delete this conversation";
    del.addEventListener("click", () => deleteConversation(c));
    item.append(open, del);
    list.appendChild(item);
  }
}

function deleteConversation(c) {
  if (controller && c === current) return;
  conversations = conversations.filter((x) => x !== c);
  save();
  if (c === current) { current = conversations[0] || null; if (!current) { newConversation(); return; } }
  renderAll();
}

// One message's body: reasoning folded, markdown content, tool calls, an error line.
function messageBody(m) {
  const body = node("div", "body");
  if (m.reasoning) {
    const det = node("details", "reasoning");
    det.appendChild(node("summary", null, "Reasoning"));
    const inner = node("div");
    inner.appendChild(toDom(parseMarkdown(m.reasoning), document));
    det.appendChild(inner);
    body.appendChild(det);
  }
  if (m.role === "assistant") body.appendChild(toDom(parseMarkdown(m.content || ""), document));
  else body.appendChild(node("div", "plain", m.content));
  for (const tc of m.tool_calls || []) {
    const box = node("div", "tool-call");
    box.appendChild(node("span", "tool-name", "tool call: " + (tc.name || "?")));
    box.appendChild(node("pre", null, tc.arguments || ""));
    body.appendChild(box);
  }
  if (m.error) body.appendChild(node("div", "error", m.error));
  return body;
}

function messageView(m) {
  const div = node("div", "msg " + m.role);
  div.appendChild(node("div", "role", m.role));
  div.appendChild(messageBody(m));
  return div;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren(...(current ? current.messages.map(messageView) : []));
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderList();
  renderMessages();
  $("stop").disabled = !controller;
  $("send").disabled = !!controller;
  $("regen").disabled = !!controller || !current || !current.messages.some((m) => m.role === "assistant");
}

function settings() {
  const num = (id) => { const v = Number.parseFloat($(id).value); return Number.isFinite(v) ? v : undefined; };
  const out = { temperature: num("temperature"), top_p: num("top_p"), max_tokens: num("max_tokens") };
  for (const k of Object.keys(out)) if (out[k] === undefined) delete out[k];
  return out;
}

function requestMessages() {
  const msgs = [];
  const system = $("system").value.trim();
  if (system) msgs.push({ role: "system", content: system });
  for (const m of current.messages) if (!m.error || m.content) msgs.push({ role: m.role, content: m.content });
  return msgs;
}

// Streams an answer into a new assistant message; the view of that message is redrawn per chunk.
async function answer() {
  const msgs = requestMessages();
  const reply = { role: "assistant", content: "" };
  current.messages.push(reply);
  controller = new AbortController();
  renderAll();
  const view = $("messages").lastElementChild;
  const redraw = () => { view.replaceChildren(node("div", "role", "assistant"), messageBody(reply)); $("messages").scrollTop = $("messages").scrollHeight; };
  try {
    await streamChat({ messages: msgs, ...settings() }, controller.signal, (chunk) => {
      for (const choice of chunk.choices || []) applyDelta(reply, choice.delta);
      redraw();
    });
  } catch (e) {
    reply.error = e.name === "AbortError" ? "stopped" : String(e.message || e);
  } finally {
    controller = null;
    save();
    renderAll();
  }
}

function send(ev) {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  if (!current) newConversation();
  current.messages.push({ role: "user", content: text });
  if (current.title === "New chat") current.title = text.slice(0, 40);
  $("prompt").value = "";
  answer();
}

function regenerate() {
  if (controller || !current) return;
  while (current.messages.length && current.messages[current.messages.length - 1].role === "assistant") current.messages.pop();
  if (current.messages.length) answer();
}

export function initChat() {
  load();
  current = conversations[0] || null;
  if (!current) newConversation();
  $("chat-form").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) send(e); });
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("regen").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", () => { if (!controller) newConversation(); });
  renderAll();
}
