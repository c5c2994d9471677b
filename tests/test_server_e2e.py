"""The real server process on the default model, as clients use it.

One `slotserver serve -np 4 -c 2048 --metrics --slot-save-path TMP --no-watch` per module:
the official `openai` client, raw llama-server requests with httpx, exact SSE framing, slot
files, metrics, disconnects that must free their slot, and 16 concurrent streams on 4 slots
that must produce exactly what each request produces alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from openai import OpenAI


LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
STARTUP_S = 180
NEAR_TIE = 0.02  # log-probability margin under which llama.cpp and we may legitimately differ


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path
    save_dir: Path
    health_before_ready: list = field(default_factory=list)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=120))

    def post(self, path: str, body: dict, **kw) -> httpx.Response:
        return self.http.post(self.url + path, json=body, **kw)

    def get(self, path: str) -> httpx.Response:
        return self.http.get(self.url + path)

    def busy_slots(self) -> int:
        return sum(s["is_processing"] for s in self.get("/slots").json())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(server: Server) -> None:
    deadline = time.time() + STARTUP_S
    while time.time() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"server exited with {server.proc.returncode}:\n{server.log.read_text()[-3000:]}")
        try:
            r = httpx.get(server.url + "/health", timeout=5)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        if r.status_code == 200:
            return
        server.health_before_ready.append((r.status_code, r.json()))
        time.sleep(0.05)
    pytest.fail(f"server not ready after {STARTUP_S} s:\n{server.log.read_text()[-3000:]}")


@contextlib.contextmanager
def serving(tmp: Path, *flags: str, save_dir: Path | None = None):
    """A `slotserver serve` process with these flags on a free port, ready; stopped afterwards."""
    port, log = free_port(), tmp / "server.log"
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "--port", str(port), *flags]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    srv = Server(f"http://127.0.0.1:{port}", proc, log, save_dir or tmp)
    try:
        wait_ready(srv)
        yield srv
    finally:
        srv.http.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    with serving(tmp, "-np", "4", "-c", "2048", "--metrics", "--slot-save-path", str(tmp / "slots"),
                 "--no-watch",  # no hot reloads mid-test
                 "--dtype", "float32", "--weights", "dense",  # llama.cpp's reference outputs are float32
                 save_dir=tmp / "slots") as srv:
        yield srv


@pytest.fixture(scope="module")
def oai(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def n_tokens(server: Server, text: str) -> int:
    return len(server.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"])


def sse_payloads(raw: bytes) -> list[str]:
    """`data: ...` lines separated by blank lines, nothing else; -> the payloads."""
    text = raw.decode()
    assert text.endswith("\n\n")
    blocks = text[:-2].split("\n\n")
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks[:3]
    return [b[len("data: "):] for b in blocks]


def completion(server: Server, prompt, n: int = 12, **extra) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, **extra}
    r = server.post("/completion", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_health_answers_503_while_loading_then_ok_and_one_summary_line(server):
    assert server.health_before_ready, "the server should answer while the model loads"
    assert all(status == 503 and body == LOADING for status, body in server.health_before_ready)
    assert server.get("/health").json() == {"status": "ok"}
    # the ready line (the load stages before it are lines of their own, each with its time)
    summary = [line for line in server.log.read_text().splitlines() if line.startswith("slotserver: ") and "slots x" in line]
    assert len(summary) == 1 and "4 slots x 512 ctx" in summary[0] and server.url in summary[0]


def test_openai_chat_non_streaming(server, oai):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = oai.chat.completions.create(model="any", messages=msgs, max_tokens=8, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    prompt = server.post("/apply-template", {"messages": msgs}).json()["prompt"]
    assert r.usage.prompt_tokens == n_tokens(server, prompt)
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 8
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_openai_chat_streaming_equals_non_streaming(server, oai):
    msgs = [{"role": "user", "content": "Name three colors."}]
    whole = oai.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0)
    chunks = list(oai.chat.completions.create(model="m", messages=msgs, max_tokens=10, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_openai_completions_streaming_and_not(server, oai):
    prompt = "The capital of France is"
    whole = oai.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text.strip()
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == n_tokens(server, prompt) and whole.usage.completion_tokens == 6
    streamed = oai.completions.create(model="m", prompt=prompt, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text


def test_greedy_completions_reproduce_llama_server(server, greedy_fixture, tokenizer):
    """llama.cpp's own greedy outputs (tests/fixtures/greedy_f32.json), all 8 prompts at once on 4
    slots, compared up to the first near-tie (where float rounding may legitimately pick the other)."""
    async def run_all() -> list[dict]:
        async with httpx.AsyncClient(timeout=300) as client:
            bodies = [{"prompt": r["prompt_ids"], "n_predict": 16, "temperature": 0, "ignore_eos": True,
                       "cache_prompt": False, "return_tokens": True} for r in greedy_fixture]
            return [r.json() for r in await asyncio.gather(*(client.post(server.url + "/completion", json=b)
                                                             for b in bodies))]

    for out, ref in zip(asyncio.run(run_all()), greedy_fixture):
        for i, (got, want) in enumerate(zip(out["tokens"], ref["generated_ids"])):
            if got != want:
                top = [lp for t, lp in ref["steps"][i]["top"] if t not in tokenizer.eog_ids]
                assert top[0] - top[1] < NEAR_TIE, f"{ref['prompt']!r}: diverged at {i} without a near-tie"
                break
        else:
            assert len(out["tokens"]) == 16 and out["content"] == tokenizer.decode(out["tokens"])


def test_llama_streaming_equals_non_streaming_with_exact_framing(server):
    body = {"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "seed": 3, "return_tokens": True}
    whole = server.post("/completion", body).json()
    with httpx.stream("POST", server.url + "/completion", json={**body, "stream": True}, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read()
    payloads = sse_payloads(raw)
    assert "[DONE]" not in payloads
    *chunks, final = map(json.loads, payloads)
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [t for c in chunks for t in c["tokens"]] == whole["tokens"]
    assert final["stop"] and final["tokens_predicted"] == whole["tokens_predicted"]


def test_openai_stream_framing_ends_with_done(server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        payloads = sse_payloads(r.read())
    assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1
    assert all(json.loads(p)["object"] == "chat.completion.chunk" for p in payloads[:-1])


def test_n_probs_and_return_tokens(server):
    out = completion(server, "The capital of France is", n=5, n_probs=4)
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == out["tokens"] and len(out["tokens"]) == 5
    for p in probs:
        tops = p["top_logprobs"]
        assert len(tops) == 4 and tops[0]["id"] == p["id"]                 # greedy: the best token
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        assert bytes(p["bytes"]).decode("utf-8", "replace") == p["token"]


def test_stop_strings(server):
    full = completion(server, "The capital of France is", n=12)["content"]
    assert "." in full
    out = completion(server, "The capital of France is", n=12, stop=["."])
    assert out["content"] == full[: full.index(".")]
    assert (out["stop_type"], out["stopping_word"]) == ("word", ".")


def test_tokenize_detokenize_match_llama_server(server, tokenize_fixture):
    for row in tokenize_fixture:
        assert server.post("/tokenize", {"content": row["text"], "parse_special": False}).json()["tokens"] == row["ids"]
        special = server.post("/tokenize", {"content": row["text"]}).json()["tokens"]
        assert special == row["ids_parse_special"]
        assert server.post("/detokenize", {"tokens": row["ids"]}).json()["content"] == row["detok"]
        assert server.post("/detokenize", {"tokens": special}).json()["content"] == row["text"]


def test_apply_template_props_and_slots(server):
    prompt = server.post("/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}).json()["prompt"]
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")
    props = server.get("/props").json()
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 512
    assert "<|im_start|>" in props["chat_template"]
    slots = server.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3] and all(s["n_ctx"] == 512 for s in slots)
    assert all("prompt" not in s for s in slots)


def test_metrics_use_llama_server_names(server):
    completion(server, "Hello", n=2)
    text = server.get("/metrics").text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:n_decode_total",
                 "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:n_busy_slots_per_decode",
                 "slotserver_defrag_moves_total", "slotserver_kv_bytes"):
        assert name in values, name
    assert values["llamacpp:tokens_predicted_total"] >= 2 and values["slotserver_kv_bytes"] > 0
    assert values["slotserver_time_to_first_token_seconds_count"] >= 1


def test_slot_save_erase_restore_round_trip(server):
    prompt = "A slot that will be saved to disk and restored"
    first = completion(server, prompt, n=4, id_slot=2)
    saved = server.post("/slots/2?action=save", {"filename": "e2e.bin"}).json()
    assert saved["id_slot"] == 2 and saved["n_saved"] >= first["tokens_evaluated"]
    assert (server.save_dir / "e2e.bin").is_file() and saved["n_written"] > 0
    assert server.post("/slots/2?action=erase", {}).json()["n_erased"] == saved["n_saved"]
    restored = server.post("/slots/2?action=restore", {"filename": "e2e.bin"}).json()
    assert restored["n_restored"] == saved["n_saved"]
    again = completion(server, prompt, n=4, id_slot=2)
    assert again["timings"]["cache_n"] >= first["tokens_evaluated"] - 1     # the restored cache was reused
    assert again["tokens"] == first["tokens"]
    assert server.post("/slots/2?action=save", {"filename": "../evil"}).status_code == 400
    assert server.post("/slots/2?action=restore", {"filename": "missing.bin"}).status_code == 404


def wait_all_idle(server: Server, within: float) -> float:
    t0 = time.time()
    while server.busy_slots():
        assert time.time() - t0 < within, "a slot is still busy"
        time.sleep(0.05)
    return time.time() - t0


# The slot must be free within 3 s of the client leaving: the 500 tokens it asked for take this
# float32 server longer than that (60-100 tokens/s on 2 cores), and 1.5 s was missed on a loaded host.
FREED_WITHIN = 3.0


def test_disconnect_mid_stream_frees_the_slot(server):
    body = {"prompt": "Write a long story about a dragon.", "n_predict": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/completion", json=body, timeout=120) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert server.busy_slots() == 1
    wait_all_idle(server, within=FREED_WITHIN)


def test_non_streaming_client_timeout_frees_the_slot(server):
    body = {"prompt": "Write a long story about a dragon.", "n_predict": 500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        server.post("/completion", body, timeout=1.0)
    wait_all_idle(server, within=FREED_WITHIN)


async def _stream_tokens(client: httpx.AsyncClient, url: str, body: dict) -> list[int]:
    tokens = []
    async with client.stream("POST", url, json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                tokens += json.loads(line[6:])["tokens"]
    return tokens


def test_sixteen_concurrent_streams_on_four_slots_match_sequential(server):
    prompts = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "List three colors:",
               "Water boils at", "1, 2, 3, 4,", "The quick brown fox", "My favourite food is"]
    bodies = [{"prompt": p, "n_predict": 8, "temperature": 0, "ignore_eos": True} for p in prompts]
    alone = [completion(server, b["prompt"], n=8, ignore_eos=True)["tokens"] for b in bodies]

    async def all_at_once() -> tuple[list[list[int]], set[int]]:
        """All 16 streams at once, polling /slots?fail_on_no_slot=1 while they run."""
        async with httpx.AsyncClient(timeout=300) as client:
            jobs = asyncio.gather(*(_stream_tokens(client, server.url + "/completion", b) for b in bodies * 2))
            seen = set()
            while not jobs.done():
                seen.add((await client.get(server.url + "/slots?fail_on_no_slot=1")).status_code)
                await asyncio.sleep(0.1)
            return await jobs, seen

    together, statuses = asyncio.run(all_at_once())
    assert together == alone * 2
    assert 503 in statuses, "with 16 requests on 4 slots, no slot should have been free for a while"
    wait_all_idle(server, within=2)
    assert server.get("/slots?fail_on_no_slot=1").status_code == 200


def test_lab_events_stream_over_sse(server):
    before = server.get("/lab").json()
    assert "seq_head_dim" in before["layouts"]
    since = max([e["seq"] for e in before["events"]], default=0)
    r = server.post("/lab/layout", {"layout": "no_such_layout"})
    assert r.status_code == 400 and "no_such_layout" in r.json()["error"]["message"]
    with httpx.stream("GET", f"{server.url}/lab/events?since={since}", timeout=30) as s:
        line = next(line for line in s.iter_lines() if line.startswith("data: "))
    event = json.loads(line[6:])
    assert event["seq"] > since and event["result"] == "refused" and event["name"] == "no_such_layout"
