"""`slotserver serve --embedding / --pooling / --reranking`: the flags, and the real process: an embedding
server starts on the tiny BERT fixture, answers embeddings, refuses completions with 501, and stops;
a model that cannot rerank stops the server with one line and exit status 2.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from embed_server import TINY_BERT
from slotserver.cli import main as cli
from slotserver.errors import ConfigError
from slotserver.server.embed_config import embedding_config_from_args


def parse(*argv: str):
    return embedding_config_from_args(cli.build_parser().parse_args(["serve", *argv]))


def test_serve_flags_make_an_embedding_config():
    assert parse() is None
    c = parse("--embeddings", "--pooling", "cls", "-ub", "128", "-c", "1024", "-np", "2", "-fa", "on")
    assert (c.pooling, c.rank, c.ubatch, c.ctx_slot, c.max_tokens(512), c.max_tokens(64)) == \
        ("cls", False, 128, 512, 128, 64)
    r = parse("--rerank")
    assert (r.pooling, r.rank) == ("rank", True)
    assert parse("--embedding", "--pooling", "rank").rank
    with pytest.raises(ConfigError, match="add --embedding"):
        parse("--pooling", "mean")
    with pytest.raises(ConfigError, match="cannot be combined"):
        parse("--reranking", "--pooling", "mean")
    assert (parse("--embedding").normalize, parse("--embedding", "--embd-normalize", "-1").normalize) == (2, -1)
    with pytest.raises(ConfigError, match="--embd-normalize 1 applies to an embedding server: add --embedding"):
        parse("--embd-normalize", "1")
    with pytest.raises(ConfigError, match="--embd-normalize must be >= -1, got -2"):
        parse("--embedding", "--embd-normalize", "-2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_an_embedding_server_process_serves_embeddings_and_refuses_completions():
    """With llama-server's --embd-normalize 1: every vector's taxicab norm is 1 unless a request asks otherwise."""
    port = _free_port()
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(TINY_BERT), "--port", str(port),
           "--embedding", "-t", "1", "--embd-normalize", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        status, body = _post(port, "/v1/embeddings", {"input": ["hello world", "x"]})
        assert status == 200 and len(body["data"]) == 2 and len(body["data"][0]["embedding"]) == 32
        assert abs(sum(abs(x) for x in body["data"][0]["embedding"]) - 1) < 1e-5   # --embd-normalize 1: taxicab
        status, body = _post(port, "/v1/embeddings", {"input": "hello world", "embd_normalize": 2})
        assert abs(sum(x * x for x in body["data"][0]["embedding"]) - 1) < 1e-5    # the request's own wins
        status, body = _post(port, "/completion", {"prompt": "hello"})
        assert status == 501 and "embedding-only" in body["error"]["message"]
    finally:
        proc.send_signal(signal.SIGINT)   # Ctrl-C: the model thread's worker stops, serve returns
        err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 130 and "Traceback" not in err, err   # the CLI's Ctrl-C status, a clean stop
    assert "tiny-bert.gguf (bert, embeddings, pooling mean, 32 dims, inputs up to 64 tokens)" in err


def test_reranking_a_model_without_a_classifier_is_one_line_and_exit_2(tmp_path):
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-llama.gguf", seed=1)
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(path), "--port", "0", "--reranking"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert "tiny-llama.gguf" in errors[0] and "classification head" in errors[0]


def test_a_bert_file_without_embedding_says_how_to_serve_it():
    from slotserver.model.gguf_file import GGUFError, GGUFFile
    from slotserver.model.spec import ModelSpec

    with pytest.raises(GGUFError, match=r"tiny-bert.gguf: bert is an embedding model.*serve --embedding"):
        ModelSpec.from_gguf(GGUFFile.open(TINY_BERT))


def test_embeddings_run_on_the_cpu_and_say_so_for_another_device():
    from slotserver.model.config import ModelConfig
    from slotserver.model.encoder.embedder import Embedder

    from types import SimpleNamespace

    # (a ModelConfig refuses cuda itself on a host without a GPU: a stand-in reaches the embedder's check)
    with pytest.raises(ConfigError, match="--device cuda: embeddings and reranking run on the CPU only"):
        Embedder.load(SimpleNamespace(device="cuda"))
    assert Embedder.load(ModelConfig(TINY_BERT, device="auto", threads=1)).dims == 32
