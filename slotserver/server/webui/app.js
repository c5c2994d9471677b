// Entry point: tabs (chat, monitor) and the API key field. Loaded as a module from index.html;
// no inline script anywhere (the Content-Security-Policy forbids it).
import { getKey, setKey } from "./api.js";
import { initChat } from "./chat.js";
import { initMonitor, startMonitor, stopMonitor } from "./monitor.js";

const $ = (id) => document.getElementById(id);

function show(view) {
  for (const v of ["chat", "monitor"]) {
    $("view-" + v).hidden = v !== view;
    $("tab-" + v).classList.toggle("active", v === view);
  }
  // poll only while the monitor is on screen
  if (view === "monitor") startMonitor(); else stopMonitor();
  if (location.hash !== "#" + view) location.hash = view;
}

function initKey() {
  const field = $("api-key");
  field.value = getKey();
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setKey(field.value.trim());
    $("key-state").textContent = field.value.trim() ? "key set" : "no key";
  });
  $("key-state").textContent = getKey() ? "key set" : "no key";
}

initKey();
initChat();
initMonitor();
$("tab-chat").addEventListener("click", () => show("chat"));
$("tab-monitor").addEventListener("click", () => show("monitor"));
const fromHash = () => show(location.hash === "#monitor" ? "monitor" : "chat");
window.addEventListener("hashchange", fromHash);   // the back button, or a link to #monitor
fromHash();
