"""A GGUF whose data holds NaN or inf: `--check-tensors` refuses it at load in one line naming the
tensor (llama.cpp's ggml_validate_row_data checks: float values, quantized blocks' scales), and
without the flag every request says the model produced NaN logits, not a bare "sampling failed"."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient
from tiny_gguf import QT, write_tiny_gguf

from slotserver.cli import main as cli
from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.errors import GGUFError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.gguf_file import GGUFFile
from slotserver.server import ServerConfig, ServerState, create_app

TENSOR = "blk.1.ffn_down.weight"
F16_NAN, F16_INF = b"\x00\x7e", b"\x00\x7c"


def poke(path, tensor: str, at: int, raw: bytes) -> None:
    """Overwrite bytes `at` bytes into `tensor`'s data (a broken file, as a bad conversion makes)."""
    info = GGUFFile.open(path).tensors[tensor]
    with open(path, "r+b") as f:
        f.seek(info.offset + at)
        f.write(raw)


@pytest.fixture
def nan_model(tmp_path):
    path = write_tiny_gguf(tmp_path / "nan.gguf")
    poke(path, TENSOR, 4 * 5, np.float32(np.nan).tobytes())   # element 5
    return path


def refusal(path) -> str:
    with pytest.raises(GGUFError) as e:
        GGUFFile.open(path).check_tensors()
    return str(e.value)


def test_a_nan_float_is_refused_naming_the_tensor_and_element(nan_model):
    assert refusal(nan_model) == (f"{nan_model}: tensor {TENSOR} (F32) holds 1 NaN values, the first at "
                                  "element 5; refused by --check-tensors")


@pytest.mark.parametrize("qtype, raw, what", [(QT.F16, F16_INF, "1 inf values, the first at element 3"),
                                              (QT.BF16, b"\x80\x7f", "1 inf values, the first at element 3")])
def test_half_precision_values_are_checked(tmp_path, qtype, raw, what):
    path = write_tiny_gguf(tmp_path / "m.gguf", tensor_type=qtype)
    poke(path, TENSOR, 2 * 3, raw)
    assert f"tensor {TENSOR} ({qtype.name}) holds {what}" in refusal(path)


# (type, byte offset of a scale in its block): d, or the second scale (m / dmin) where there is one
SCALES = [(QT.Q4_0, 0), (QT.Q4_1, 2), (QT.Q5_0, 0), (QT.Q5_1, 2), (QT.Q8_0, 0), (QT.Q4_K, 2), (QT.Q6_K, 208)]


@pytest.mark.parametrize("qtype, offset", SCALES, ids=lambda v: getattr(v, "name", str(v)))
def test_a_quantized_blocks_nan_scale_is_refused(tmp_path, qtype, offset):
    import gguf
    path = write_tiny_gguf(tmp_path / "q.gguf", tensor_type=qtype, d_model=256, d_ff=256, n_heads=4, n_kv_heads=2)
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    poke(path, TENSOR, 2 * block_bytes + offset, F16_NAN)   # block 2
    message = refusal(path)
    assert f"tensor {TENSOR} ({qtype.name}) has 1 NaN block scales, the first in block 2" in message


def test_clean_files_pass(tmp_path, smollm_path):
    GGUFFile.open(write_tiny_gguf(tmp_path / "ok.gguf")).check_tensors()
    GGUFFile.open(write_tiny_gguf(tmp_path / "ok8.gguf", tensor_type=QT.Q8_0)).check_tensors()
    GGUFFile.open(smollm_path).check_tensors()   # the default model, Q4_1


def test_generate_check_tensors_refuses_in_one_line(nan_model, capsys):
    status = cli.main(["generate", "--check-tensors", "-m", str(nan_model), "hi"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and f"tensor {TENSOR} (F32) holds 1 NaN" in lines[0], lines


def test_serve_check_tensors_stops_with_one_line_naming_the_tensor(nan_model):
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(nan_model), "--port", "0",
           "--check-tensors", "--no-watch"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert f"tensor {TENSOR} (F32) holds 1 NaN values" in errors[0] and "--check-tensors" in errors[0]


def test_without_the_flag_a_request_says_the_model_produced_nan_logits(nan_model):
    threads = torch.get_num_threads()
    bundle = ModelBundle.load(ModelConfig(nan_model, threads=1))
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=64)).start()
    try:
        state = ServerState(ServerConfig(model_path=str(nan_model)))
        state.set_loaded(bundle, engine)
        with TestClient(create_app(state)) as c:
            for path, body in (("/completion", {"prompt": "hi", "n_predict": 2}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
                r = c.post(path, json=body)
                assert r.status_code == 500, r.text
                message = r.json()["error"]["message"]
                assert message.startswith("the model produced NaN logits") and "--check-tensors" in message
    finally:
        engine.stop()
        torch.set_num_threads(threads)
