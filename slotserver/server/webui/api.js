// Talking to the server: the API key (typed into the page, kept in sessionStorage, sent as
// `Authorization: Bearer`, never in a URL), JSON calls, and streamed chat completions.
import { SseParser } from "./render.js";

const KEY = "slotserver.apiKey";
// The folder the page was served from: "" at /, "/llm" under --api-prefix /llm (served at /llm/).
const BASE = location.pathname.replace(/\/[^/]*$/, "");

export function getKey() { return sessionStorage.getItem(KEY) || ""; }
export function setKey(k) { if (k) sessionStorage.setItem(KEY, k); else sessionStorage.removeItem(KEY); }

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";   // the lab's verbs take only JSON
  const k = getKey();
  if (k) h["Authorization"] = "Bearer " + k;
  return h;
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// The server's error message from an error answer ({"error": {"message"}}), else the status text.
async function errorOf(r) {
  let msg = r.status + " " + r.statusText;
  try {
    const body = await r.json();
    if (body && body.error && body.error.message) msg = r.status + ": " + body.error.message;
  } catch (_) { /* not JSON: keep the status line */ }
  if (r.status === 401) msg += " (set the API key at the top right)";
  return new ApiError(r.status, msg);
}

export async function getJson(path, signal) {
  const r = await fetch(BASE + path, { headers: headers(false), signal, cache: "no-store", credentials: "same-origin" });
  if (!r.ok) throw await errorOf(r);
  return r.json();
}

export async function postJson(path, body, signal) {
  const r = await fetch(BASE + path, { method: "POST", headers: headers(true), body: JSON.stringify(body), signal,
    credentials: "same-origin" });
  if (!r.ok) throw await errorOf(r);
  return r.json();
}

// POST /v1/chat/completions with stream: true; `onChunk` gets each decoded JSON chunk. Resolves
// when the stream ends ([DONE] or EOF); rejects with AbortError when `signal` aborts.
export async function streamChat(body, signal, onChunk) {
  const r = await fetch(BASE + "/v1/chat/completions", { method: "POST", headers: headers(true),
    body: JSON.stringify({ ...body, stream: true }), signal, credentials: "same-origin" });
  if (!r.ok) throw await errorOf(r);
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  for (;;) {
    const { value, done } = await reader.read();
    const events = parser.feed(done ? decoder.decode() + "\n\n" : decoder.decode(value, { stream: true }));
    for (const ev of events) {
      if (ev.data === "[DONE]") return;
      const chunk = JSON.parse(ev.data);
      if (chunk.error) throw new ApiError(chunk.error.code || 500, chunk.error.message || "stream error");
      onChunk(chunk);
    }
    if (done) return;
  }
}
