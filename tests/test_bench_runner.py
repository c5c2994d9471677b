"""`slotserver bench` against streams and servers: SSE parsing, failures, the CLI, a live server.

Recorded byte streams of both formats are parsed whole and cut at arbitrary points (network
reads end anywhere, even inside a UTF-8 character). Scripted fake servers (httpx.MockTransport,
and a real starlette app under uvicorn for dropped connections) answer some requests with
errors; the result must count those as failed with their messages and measure only the rest.
The last test runs the real CLI against a live `slotserver serve` on a tiny model.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from slotserver.bench.client import send_request
from slotserver.bench.config import BenchConfig
from slotserver.bench.dataset import Prompt
from slotserver.bench.record import RequestRecord
from slotserver.bench.runner import run_benchmark
from slotserver.bench.sse import SSEDecoder
from slotserver.bench.streams import FORMATS
from slotserver.cli.main import main
from tiny_gguf import write_tiny_gguf


def oa_chunk(text: str, finish=None, usage=None) -> bytes:
    obj = {"id": "cmpl-1", "object": "text_completion", "choices": [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def openai_stream(n: int, prompt_tokens: int = 4) -> bytes:
    """What slotserver and llama-server send: n token chunks, the finish chunk with usage, [DONE]."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    return b"".join([oa_chunk("é" if i == 1 else f" t{i}") for i in range(n)]
                    + [oa_chunk("", "length", usage), b"data: [DONE]\n\n"])


LLAMA_STREAM = (  # recorded from /completion; the 2nd chunk holds 2 tokens (a held-back piece)
    b'data: {"index":0,"content":"^","tokens":[61],"stop":false,"tokens_predicted":1}\n\n'
    b'data: {"index":0,"content":" c\xc3\xa9","tokens":[271,195],"stop":false,"tokens_predicted":3}\n\n'
    b': keep-alive comment\n\n'
    b'data: {"index":0,"content":" t","tokens":[256],"stop":false,"tokens_predicted":4}\n\n'
    b'data: {"index":0,"content":"","tokens":[],"stop":true,"tokens_predicted":4,'
    b'"tokens_evaluated":16,"stop_type":"limit","timings":{"predicted_n":4,"prompt_n":16}}\n\n')


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def decode(pieces: list[bytes]) -> list[str]:
    dec = SSEDecoder()
    return [payload for piece in pieces for payload in dec.feed(piece)]


@given(st.lists(st.integers(0, 10_000), max_size=30), st.booleans())
def test_sse_events_survive_any_split_of_the_byte_stream(cuts, crlf):
    for stream in (openai_stream(3), LLAMA_STREAM):
        data = stream.replace(b"\n", b"\r\n") if crlf else stream
        whole = decode([data])
        assert decode(split(data, cuts)) == whole
        assert len(whole) == (5 if stream is not LLAMA_STREAM else 4)
    assert decode([openai_stream(3)])[1] == oa_chunk("é")[len(b"data: "):-2].decode()


def test_sse_joins_multiline_data_and_drops_an_unterminated_event():
    dec = SSEDecoder()
    assert dec.feed(b"event: x\ndata: a\ndata:b\nid: 1\n\n: c\n\ndata: cut") == ["a\nb"]
    assert dec.pending


def interpret(backend: str, data: bytes) -> tuple[RequestRecord, int]:
    """(record, index of the completing event) after applying the stream's events in order."""
    record, fmt = RequestRecord(index=0, start=0.0), FORMATS[backend]
    for i, payload in enumerate(decode([data])):
        if fmt.on_event(payload, record, t=float(i + 1)):
            return record, i
    return record, -1


def test_openai_stream_meaning_token_chunks_usage_and_done():
    record, done_at = interpret("openai", openai_stream(3, prompt_tokens=16))
    assert done_at == 4                                     # [DONE] completes it
    assert record.chunk_times == [1.0, 2.0, 3.0]            # the empty finish chunk is not a token
    assert (record.output_tokens, record.input_tokens) == (3, 16)


def test_llama_stream_meaning_tokens_per_chunk_and_final_stop():
    record, done_at = interpret("llama", LLAMA_STREAM)
    assert done_at == 3 and record.chunk_times == [1.0, 2.0, 3.0]
    assert record.chunk_tokens == [1, 2, 1]
    assert (record.output_tokens, record.input_tokens) == (4, 16)


async def pieces(*chunks: bytes, error: Exception | None = None):
    for c in chunks:
        await asyncio.sleep(0)
        yield c
    if error is not None:
        raise error


def one_request(handler, backend="openai") -> RequestRecord:
    cfg = BenchConfig(base_url="http://fake", backend=backend, output_len=3)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await send_request(http, cfg, Prompt((1, 2, 3, 4), 4), 0, "m")
    return asyncio.run(go())


@pytest.mark.parametrize("backend, data", [("openai", openai_stream(3)), ("llama", LLAMA_STREAM)])
def test_client_measures_a_stream_cut_into_small_reads(backend, data):
    r = one_request(lambda req: httpx.Response(200, content=pieces(*split(data, list(range(0, 999, 7))))),
                    backend)
    assert r.success and r.error == "" and len(r.chunk_times) == 3
    assert r.output_tokens == (3 if backend == "openai" else 4)
    assert r.start <= r.chunk_times[0] <= r.chunk_times[-1] <= r.end


ERROR_503 = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


@pytest.mark.parametrize("response, message", [
    (lambda: httpx.Response(503, json=ERROR_503), "HTTP 503: Loading model"),
    (lambda: httpx.Response(500, text="<html>oops</html>"), "HTTP 500: <html>oops</html>"),
    (lambda: httpx.Response(200, content=pieces(openai_stream(3)[:300])), "ended before data: [DONE]"),
    (lambda: httpx.Response(200, content=pieces(oa_chunk("a"), error=httpx.ReadError("reset"))),
     "ReadError: reset"),
    (lambda: httpx.Response(200, content=pieces(b'data: {"error":{"message":"slot crashed"}}\n\n')),
     "error in stream: slot crashed"),
    (lambda: httpx.Response(200, content=pieces(b"data: [DONE]\n\n")), "without any generated token"),
    (lambda: httpx.Response(200, content=pieces(b"data: {not json\n\n")), "unreadable stream event"),
])
def test_client_turns_every_failure_into_a_failed_record_with_its_message(response, message):
    r = one_request(lambda req: response())
    assert not r.success and message in r.error


class ScriptedServer:
    """A MockTransport handler: /v1/models, and completions whose outcome cycles through `modes`."""

    def __init__(self, modes: list[str]):
        self.modes, self.bodies, self.auth = modes, [], []
        self.in_flight = self.peak = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "meta": {"n_vocab": 100}}]})
        mode = self.modes[len(self.bodies) % len(self.modes)]
        body = json.loads(request.content)
        self.bodies.append(body)
        self.auth.append(request.headers.get("authorization"))
        if mode == "503":
            return httpx.Response(503, json=ERROR_503)
        return httpx.Response(200, content=self.stream(mode, body.get("max_tokens") or body["n_predict"]))

    async def stream(self, mode: str, n: int):
        """Cut into 90-byte reads; the request is over for the server at its last write."""
        chunks = split(openai_stream(n, prompt_tokens=4), list(range(0, 5000, 90)))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        for i, piece in enumerate(chunks):
            await asyncio.sleep(0)
            if (mode == "drop" and i == 3) or i == len(chunks) - 1:
                self.in_flight -= 1
            if mode == "drop" and i == 3:
                raise httpx.RemoteProtocolError("peer closed connection (incomplete chunked read)")
            yield piece


def bench(server: ScriptedServer, **kw):
    cfg = BenchConfig(base_url="http://fake", input_len=4, output_len=3, progress=False, **kw)
    return asyncio.run(run_benchmark(cfg, transport=httpx.MockTransport(server)))


def test_mixed_failures_are_counted_and_only_completed_requests_are_measured():
    server = ScriptedServer(["ok", "503", "drop", "ok"])
    result = bench(server, num_prompts=8)
    m = result.metrics
    assert (m.completed, m.failed) == (4, 4)
    assert {e.split(":")[0] for e in m.errors} == {"HTTP 503", "RemoteProtocolError"}
    assert m.total_output_tokens == 4 * 3 and m.total_input_tokens == 4 * 4
    assert m.request_throughput == pytest.approx(4 / m.duration_s)
    assert m.ttft.count == 4 and m.tpot.count == 4 and m.itl.count == 4 * 2


def test_requests_follow_the_flags_and_warmup_is_not_counted():
    server = ScriptedServer(["ok"])
    result = bench(server, num_prompts=12, max_concurrency=3, warmup=2, api_key="k1", temperature=0.5)
    assert len(server.bodies) == 14 and len(result.records) == 12 and len(result.warmup) == 2
    assert result.metrics.completed == 12 and server.peak == 3
    assert set(server.auth) == {"Bearer k1"} and result.model == "tiny"
    body = server.bodies[-1]
    assert body["max_tokens"] == 3 and body["ignore_eos"] and body["stream"] and body["model"] == "tiny"
    assert body["temperature"] == 0.5 and len(body["prompt"]) == 4
    assert all(0 <= t < 100 for t in body["prompt"])
    llama = ScriptedServer(["ok"])
    bench(llama, backend="llama", num_prompts=1, vocab_size=50)
    assert llama.bodies[0]["n_predict"] == 3 and llama.bodies[0]["cache_prompt"] is False


def fake_http_app() -> Starlette:
    """/{scenario}/v1/...: "mixed" cycles ok, 503, a dropped connection, an error event; "down"
    is always 503. A drop is an exception inside the stream: uvicorn cuts the connection."""
    counters: dict[str, int] = {}

    async def models(request):
        return JSONResponse({"data": [{"id": "fake", "meta": {"n_vocab": 100}}]})

    async def completions(request):
        scenario, body = request.path_params["scenario"], await request.json()
        i = counters[scenario] = counters.get(scenario, -1) + 1
        mode = "503" if scenario == "down" else ["ok", "503", "drop", "error"][i % 4]
        if mode == "503":
            return JSONResponse(ERROR_503, status_code=503)

        async def gen():
            if mode == "ok":
                yield openai_stream(body["max_tokens"])
                return
            yield oa_chunk("x")
            if mode == "drop":
                raise RuntimeError("connection dropped by the fake server")
            yield b'data: {"error":{"message":"engine failed"}}\n\n'

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/{scenario}/v1/models", models),
                             Route("/{scenario}/v1/completions", completions, methods=["POST"])])


@contextmanager
def uvicorn_thread(app):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_cli_reports_real_network_failures_and_exits_1_when_all_fail(tmp_path, capsys):
    with uvicorn_thread(fake_http_app()) as url:
        out = tmp_path / "mixed.json"
        args = ["bench", "--input-len", "4", "--output-len", "3", "--no-progress"]
        assert main(args + ["--base-url", url + "/mixed", "--num-prompts", "8", "--json", str(out)]) == 0
        res = json.loads(out.read_text())
        assert (res["completed"], res["failed"], res["total_output_tokens"]) == (2, 6, 2 * 3)
        assert res["request_throughput"] == pytest.approx(2 / res["duration"])
        messages = " | ".join(r["error"] for r in res["requests"] if not r["success"])
        for part in ("HTTP 503: Loading model", "RemoteProtocolError", "error in stream: engine failed"):
            assert part in messages
        assert res["error_counts"]["HTTP 503: Loading model"] == 2
        shown = capsys.readouterr().out
        assert "6 of 8 requests failed" in shown and "2 x HTTP 503: Loading model" in shown
        down = tmp_path / "down.json"
        assert main(args + ["--base-url", url + "/down", "--num-prompts", "3", "--json", str(down)]) == 1
        assert json.loads(down.read_text())["completed"] == 0
        assert "all 3 requests failed" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    """A real `slotserver serve` on a tiny model; skipped (with its log) if it cannot start."""
    root = tmp_path_factory.mktemp("live")
    model, port = write_tiny_gguf(root / "tiny.gguf", ctx_len=2048), free_port()
    log = open(root / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(model),
                             "--port", str(port), "-np", "2", "-c", "1024"],
                            stdout=log, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            log.seek(0)
            pytest.skip(f"slotserver serve did not start (exit {proc.poll()}): {log.read()[-800:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def test_real_cli_against_a_live_slotserver(live_server, tmp_path):
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "slotserver.cli.main", "bench", "--base-url", live_server,
                           "--num-prompts", "6", "--input-len", "16", "--output-len", "8",
                           "--max-concurrency", "2", "--warmup", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads(out.read_text())
    assert (res["completed"], res["failed"], res["total_output_tokens"]) == (6, 0, 48)
    assert res["total_input_tokens"] == 6 * 16 and res["warmup"]["completed"] == 1
    assert all(r["output_tokens"] == 8 and len(r["itls_ms"]) >= 1 for r in res["requests"])
    assert res["mean_ttft_ms"] > 0 and res["mean_tpot_ms"] > 0 and res["config"]["input_len"] == 16
    # The llama-server API of the same server, in-process this time.
    llama = tmp_path / "llama.json"
    assert main(["bench", "--base-url", live_server, "--backend", "llama", "--num-prompts", "4",
                 "--input-len", "16", "--output-len", "8", "--json", str(llama), "--no-progress"]) == 0
    res = json.loads(llama.read_text())
    assert (res["completed"], res["failed"], res["total_output_tokens"]) == (4, 0, 32)
