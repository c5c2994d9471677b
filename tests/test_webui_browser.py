"""The web page in a real browser: headless Chromium driven over its DevTools protocol, against a
real `slotserver serve` on the tiny random model.

Why the protocol over a pipe (`--remote-debugging-pipe`: JSON messages ending in NUL on fds 3
and 4) and not Playwright or a websocket: it needs nothing but Chromium itself (Debian's
`chromium` package), no Python package and no browser download. Skipped when no Chromium is
found (set CHROMIUM=/path/to/chrome to pick one). Screenshots go to a tmp folder, and also to
$WEBUI_SCREENSHOTS when set (docs/img/ was made that way).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from test_server_e2e import Server, free_port, wait_ready
from tiny_gguf import write_tiny_gguf

CHROMIUM = os.environ.get("CHROMIUM") or next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
KEY = "webui-test-key"
pytestmark = [pytest.mark.browser, pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")]


class Browser:
    """One Chromium process and one page, over the DevTools pipe."""

    def __init__(self, profile: Path) -> None:
        to_r, self._to_w = os.pipe()          # our commands -> Chromium's fd 3
        self._from_r, from_w = os.pipe()      # Chromium's fd 4 -> its answers and events
        flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                 "--remote-debugging-pipe", f"--user-data-dir={profile}", "--window-size=1280,860"]
        self.proc = subprocess.Popen(["bash", "-c", f'exec "$0" "$@" 3<&{to_r} 4>&{from_w}', CHROMIUM, *flags],
                                     pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_r), os.close(from_w)
        self._next, self._answers, self.logs = 0, {}, []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.page(f"{domain}.enable")

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_r, 65536):
            buf += chunk
            *msgs, buf = buf.split(b"\0")
            for raw in msgs:
                msg = json.loads(raw)
                with self._cv:
                    if "id" in msg:
                        self._answers[msg["id"]] = msg
                    elif msg.get("method") in ("Runtime.exceptionThrown", "Log.entryAdded", "Runtime.consoleAPICalled"):
                        self.logs.append(msg)
                    self._cv.notify_all()

    def call(self, method: str, session: str | None = None, timeout: float = 15, **params) -> dict:
        with self._cv:
            self._next += 1
            mid = self._next
        msg = {"id": mid, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        with self._cv:
            if not self._cv.wait_for(lambda: mid in self._answers, timeout):
                raise TimeoutError(method)
            answer = self._answers.pop(mid)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def page(self, method: str, **params) -> dict:
        return self.call(method, self.session, **params)

    def js(self, expression: str):
        r = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression: str, timeout: float = 10, what: str = "") -> object:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or expression}")

    def open(self, url: str) -> None:
        self.page("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && !!document.getElementById('conv-list').children.length",
                  what="the page to load")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.page("Page.captureScreenshot", format="png")["data"]))

    def problems(self) -> list[str]:
        """Script exceptions and error-level log entries (a CSP violation is one)."""
        out = []
        for m in self.logs:
            p = m["params"]
            if m["method"] == "Runtime.exceptionThrown":
                out.append(json.dumps(p["exceptionDetails"])[:400])
            elif m["method"] == "Log.entryAdded" and p["entry"]["level"] == "error" and "favicon" not in p["entry"].get("url", ""):
                out.append(p["entry"]["text"])
        return out

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A tiny-model server with an API key, serving (and watching) a copy of the lab's modules."""
    tmp = tmp_path_factory.mktemp("webui")
    model = write_tiny_gguf(tmp / "tiny.gguf")
    port, log = free_port(), tmp / "server.log"
    subprocess.run([sys.executable, "-m", "slotserver.cli.main", "lab", "init", str(tmp / "lab")], check=True,
                   capture_output=True)
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(model), "-np", "2", "-c", "512",
           "--port", str(port), "--dtype", "float32", "--no-warmup", "--lab", str(tmp / "lab"), "--api-key", KEY]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc, log, tmp,
                    http=httpx.Client(timeout=120, headers={"Authorization": f"Bearer {KEY}"}))
    try:
        wait_ready(server)
        yield server
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    b.page("Emulation.setDeviceMetricsOverride", width=1280, height=860, deviceScaleFactor=1, mobile=False)
    yield b
    b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def save_shot(browser: Browser, shots: Path, name: str) -> None:
    browser.screenshot(shots / name)
    if os.environ.get("WEBUI_SCREENSHOTS"):
        shutil.copy(shots / name, Path(os.environ["WEBUI_SCREENSHOTS"]) / name)


def open_page(browser: Browser, server: Server) -> None:
    """The page, with the API key typed into its field (sessionStorage keeps it for the tab)."""
    browser.open(server.url + "/")
    set_value(browser, "api-key", KEY)
    browser.js("document.getElementById('key-form').requestSubmit()")


def set_value(browser: Browser, element_id: str, value: str) -> None:
    browser.js(f"document.getElementById({json.dumps(element_id)}).value = {json.dumps(value)}")


def click(browser: Browser, element_id: str) -> None:
    browser.js(f"document.getElementById({json.dumps(element_id)}).click()")


ASSISTANT_TEXT = "Array.from(document.querySelectorAll('#messages .msg.assistant .body')).map(e => e.textContent)"


def test_chat_streams_an_answer_and_keeps_it(browser, server, shots):
    open_page(browser, server)
    set_value(browser, "max_tokens", "12")
    set_value(browser, "temperature", "0")   # greedy: the random model's answer is the same each run
    set_value(browser, "prompt", "Say hello")
    click(browser, "send")   # its handler disables Send before it first awaits
    browser.wait("document.getElementById('send').disabled === false", timeout=20, what="the answer to end")
    texts = browser.js(ASSISTANT_TEXT)
    assert len(texts) == 1 and texts[0].strip(), texts
    stored = json.loads(browser.js("localStorage.getItem('slotserver.conversations')"))
    assert [m["role"] for m in stored[0]["messages"]] == ["user", "assistant"]
    assert stored[0]["messages"][1]["content"] == texts[0]
    save_shot(browser, shots, "webui-chat.png")
    assert browser.problems() == []


def test_stop_ends_a_generation(browser, server):
    open_page(browser, server)
    click(browser, "new-chat")
    set_value(browser, "max_tokens", "4000")
    set_value(browser, "temperature", "0")   # greedy: never an early end of text from the random model
    set_value(browser, "prompt", "Tell a long story")
    click(browser, "send")
    browser.wait(f"{ASSISTANT_TEXT}.slice(-1)[0].length > 0", what="streamed text")
    click(browser, "stop")
    browser.wait("document.getElementById('send').disabled === false", what="the stop")
    assert "stopped" in browser.js(ASSISTANT_TEXT)[-1]
    deadline = time.monotonic() + 10
    while server.busy_slots() and time.monotonic() < deadline:   # the server frees the slot
        time.sleep(0.1)
    assert server.busy_slots() == 0
    # Regenerate replaces the stopped answer with a new one
    set_value(browser, "max_tokens", "6")
    click(browser, "regen")
    browser.wait("document.getElementById('send').disabled === false", timeout=20, what="the regenerated answer")
    texts = browser.js(ASSISTANT_TEXT)
    assert len(texts) == 1 and "stopped" not in texts[0], texts


def test_model_text_is_never_html(browser, server):
    evil = "<script>window.__xss=1</script><img src=x onerror=\"window.__xss=2\"> **bold** `<b>code</b>`"
    conv = [{"id": "x", "title": "evil", "messages": [{"role": "user", "content": evil},
                                                     {"role": "assistant", "content": evil, "reasoning": evil,
                                                      "tool_calls": [{"id": "c", "name": "<img src=x>",
                                                                      "arguments": evil}]}]}]
    browser.js(f"localStorage.setItem('slotserver.conversations', {json.dumps(json.dumps(conv))})")
    browser.open(server.url + "/")
    time.sleep(0.3)
    assert browser.js("document.querySelectorAll('#messages script, #messages img, #messages b').length") == 0
    assert browser.js("window.__xss === undefined")
    assert browser.js("document.querySelectorAll('#messages strong').length") >= 1
    assert "<script>window.__xss=1</script>" in browser.js(ASSISTANT_TEXT)[0]
    # reasoning is folded away; the tool call is shown, as text
    assert browser.js("document.querySelector('#messages details.reasoning').open") is False
    assert "tool call: <img src=x>" in browser.js("document.querySelector('#messages .tool-call').textContent")
    browser.js("localStorage.clear()")


def test_monitor_switches_a_layout_and_shows_it(browser, server, shots):
    open_page(browser, server)
    click(browser, "tab-monitor")
    browser.wait("document.querySelectorAll('#slots-body tr').length === 2", what="two slot rows")
    browser.wait("document.querySelectorAll('#kernels-body tr').length > 0", what="kernel rows")
    browser.wait("document.querySelectorAll('#streams-body tr').length >= 2", what="stream map rows")
    browser.wait("document.querySelectorAll('#layout-select option').length > 1", what="layout choices")
    browser.js("document.getElementById('layout-select').value = 'paged'")
    click(browser, "layout-switch")
    browser.wait("document.getElementById('mon-header').textContent.includes('layout paged')", what="layout paged")
    browser.wait("Array.from(document.querySelectorAll('#events-body tr')).some(r => "
                 "r.textContent.includes('swapped') && r.textContent.includes('paged.py'))", what="the swap event")
    assert "swapped" in browser.js("document.getElementById('lab-result').textContent")
    # generate something so the charts and the context bars have data in the screenshot
    server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24})
    time.sleep(1.2)
    save_shot(browser, shots, "webui-monitor.png")
    assert browser.problems() == []


def test_without_the_key_the_page_says_so_and_with_it_goes_live(browser, server):
    browser.open(server.url + "/")
    browser.js("sessionStorage.clear()")
    click(browser, "tab-monitor")
    browser.wait("document.getElementById('mon-status').textContent.includes('401')", what="a 401 in the status")
    set_value(browser, "api-key", KEY)
    browser.js("document.getElementById('key-form').requestSubmit()")
    browser.wait("document.getElementById('mon-status').textContent.includes('live')", what="the monitor going live")
    assert KEY not in browser.js("location.href")


def test_a_kernel_saved_in_the_lab_folder_shows_in_the_monitor(browser, server):
    open_page(browser, server)
    click(browser, "tab-monitor")
    browser.wait("document.querySelectorAll('#kernels-body tr').length > 0", what="kernel rows")
    version = "Array.from(document.querySelectorAll('#kernels-body tr')).find(r => r.cells[0].textContent === 'rms_norm').cells[2].textContent"
    before = browser.js(version)
    kernel = server.save_dir / "lab" / "kernels" / "rms_norm.py"
    kernel.write_text(kernel.read_text() + "\n# an edit the monitor must show\n")
    browser.wait(f"{version} !== {json.dumps(before)}", timeout=15, what="the new rms_norm version")
    browser.wait("Array.from(document.querySelectorAll('#events-body tr')).some(r => "
                 "r.textContent.includes('rms_norm') && r.textContent.includes('swapped'))", what="the swap event")
