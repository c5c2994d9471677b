"""llama-server's flags over what a GGUF says of itself: `--override-kv`, the rope/YaRN flags,
`-c 0`, and control vectors. That the rope flags compute what llama-server computes with them is test_arch_fixtures.py's
ROPE_FLAGS cases; here, what a user sees: settings parsed, values replaced, errors that name the
flag, and a server that answers with them.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from test_server_cli import parse, run_cli
from test_arch_fixtures import _decoded
from test_server_e2e import serving
from tiny_gguf import write_gguf

from slotserver.cli import main as cli
from slotserver.errors import ConfigError
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.control_vector import load_control
from slotserver.model.default_model import default_model_path
from slotserver.model.model import LlamaModel
from slotserver.model.weights import WeightFormat
from slotserver.model.metadata_overrides import parse_overrides
from slotserver.server.config_from_args import plan_from_args, server_config_from_args

TINY = Path(__file__).parent / "fixtures" / "archs" / "llama3_freqs.gguf"   # llama, context_length 512
SMOLLM3 = TINY.with_name("smollm3.gguf")   # 5 layers, width 32
BOS = 307


def test_override_items_parse_as_llama_cpp_reads_them():
    assert parse_overrides("tokenizer.ggml.add_bos_token=bool:false,llama.context_length=int:300") == (
        ("tokenizer.ggml.add_bos_token", False), ("llama.context_length", 300))
    assert parse_overrides("a.b=float:0.25") == (("a.b", 0.25),)
    assert parse_overrides("general.name=str:my: model") == (("general.name", "my: model"),)
    args = parse("-m", str(TINY), "--override-kv", "a=int:1,b=bool:true", "--override-kv", "c=str:x")
    assert plan_from_args(args).model.kv_overrides == (("a", 1), ("b", True), ("c", "x"))


@pytest.mark.parametrize("item, words", [
    ("no_equals", "KEY=TYPE:VALUE"), ("k=int", "the type must be one of"), ("k=long:3", "the type must be one of"),
    ("k=bool:yes", "'yes' is not a bool (true or false)"), ("k=int:3.5", "'3.5' is not an int"),
    ("k=float:abc", "'abc' is not a float"), ("k=str:" + "x" * 128, "at most 127 characters"),
    ("=int:1", "KEY=TYPE:VALUE"),
])
def test_a_malformed_override_is_one_line_naming_it(capsys, item, words):
    status, err = run_cli(capsys, "-m", str(TINY), "--override-kv", item)
    assert status == 2 and len(err) == 1 and "--override-kv" in err[0] and words in err[0]


def test_an_override_reaches_every_reader_of_the_metadata():
    """The tokenizer's BOS switch and the spec's context both read the replaced values."""
    config = ModelConfig(TINY, kv_overrides=(("tokenizer.ggml.add_bos_token", True), ("llama.context_length", 300)))
    bundle = ModelBundle.load(config)
    assert bundle.tokenizer.encode("hi", add_special=True)[0] == BOS
    assert bundle.model.spec.ctx_train == 300 and bundle.metadata["llama.context_length"] == 300
    plain = ModelBundle.load(ModelConfig(TINY))
    assert plain.tokenizer.encode("hi", add_special=True)[0] != BOS and plain.model.spec.ctx_train == 512


@pytest.mark.parametrize("override, words", [
    (("llama.context_length", 3.0), "holds an int there, the override is a float"),
    (("tokenizer.ggml.add_bos_token", 1), "holds a bool there, the override is an int"),
    (("tokenizer.ggml.tokens", "x"), "holds an array there"),
])
def test_an_override_of_another_type_is_refused_naming_the_key(override, words):
    with pytest.raises(ConfigError, match=f"--override-kv {override[0]}: .*{words}"):
        ModelBundle.load(ModelConfig(TINY, kv_overrides=(override,)))


def test_ctx_size_zero_is_the_models_training_context_per_slot_stretched_by_yarn():
    assert plan_from_args(parse("-m", str(TINY), "-c", "0", "-np", "1")).engine.ctx_size == 512
    assert plan_from_args(parse("-m", str(TINY), "-c", "0", "-np", "3")).engine.ctx_size == 3 * 512
    auto = plan_from_args(parse("-m", str(TINY), "-c", "0")).engine   # llama-server's automatic slots: unified
    assert (auto.kv_unified, auto.kv_pool_cells, auto.ctx_size) == (True, 512, 4 * 512)   # any slot up to 512
    shared = plan_from_args(parse("-m", str(TINY), "-c", "0", "-no-kvu")).engine
    assert (shared.kv_unified, shared.ctx_size) == (False, 512)
    bert = Path(__file__).parent / "fixtures" / "bert" / "tiny-bert.gguf"   # context 64
    assert server_config_from_args(parse("-m", str(bert), "-c", "0", "--embedding")).embedding.ctx_slot == 64
    unified = plan_from_args(parse("-m", str(TINY), "-c", "0", "-np", "3", "-kvu")).engine
    assert (unified.ctx_size, unified.kv_pool_cells) == (3 * 512, 512)    # each slot up to 512, one pool of 512
    args = parse("-m", str(TINY), "-c", "0", "-np", "2", "--rope-scaling", "yarn", "--rope-scale", "4",
                 "--yarn-orig-ctx", "100")
    assert plan_from_args(args).engine.ctx_size == 2 * 400          # n_ctx_orig_yarn / freq_scale per slot
    assert server_config_from_args(args).embedding is None
    overridden = parse("-m", str(TINY), "-c", "0", "-np", "1", "--override-kv", "llama.context_length=int:320")
    assert plan_from_args(overridden).engine.ctx_size == 320
    odd = parse("-m", str(TINY), "-c", "0", "-np", "1", "--rope-scaling", "yarn", "--rope-scale", "7",
                "--yarn-orig-ctx", "4096")
    assert plan_from_args(odd).engine.ctx_size == 28671             # llama.cpp's float32 4096 / (1/7)
    assert plan_from_args(parse("-m", str(TINY), "-c", "1024")).engine.ctx_size == 1024


def test_rope_flags_parse_into_the_models_settings(monkeypatch):
    rope = plan_from_args(parse("-m", str(TINY), "--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx",
                                "32768", "--rope-freq-base", "0", "--yarn-beta-fast", "-1")).model.rope_flags
    assert (rope.kind, rope.freq_scale, rope.orig_ctx, rope.freq_base, rope.beta_fast) == ("yarn", 0.25, 32768, None, None)
    later = plan_from_args(parse("-m", str(TINY), "--rope-scale", "4", "--rope-freq-scale", "0.5")).model.rope_flags
    assert later.freq_scale == 0.5                                   # one setting, the later flag wins
    monkeypatch.setenv("LLAMA_ARG_ROPE_SCALE", "2")
    assert plan_from_args(parse("-m", str(TINY))).model.rope_flags.freq_scale == 0.5


@pytest.mark.parametrize("flags, words", [
    (("--rope-scaling", "ntk"), "--rope-scaling: invalid choice"), (("--rope-scale", "0"), "must be positive"),
    (("--rope-freq-base", "fast"), "'fast' is not a number"), (("--yarn-orig-ctx", "-5"), "--yarn-orig-ctx must be"),
])
def test_bad_rope_values_are_one_line_naming_the_flag(capsys, flags, words):
    status, err = run_cli(capsys, "-m", str(TINY), *flags)
    assert status == 2 and len(err) == 1 and words in err[0]


def test_a_server_started_as_qwens_model_card_says_serves_the_stretched_context(tmp_path):
    """`--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx N -c 0` and an override of the BOS switch:
    the stretched training context in /v1/models, slots that large, and the BOS the override asked for."""
    with serving(tmp_path, "-m", str(TINY), "-c", "0", "-np", "1", "--rope-scaling", "yarn", "--rope-scale", "4",
                 "--yarn-orig-ctx", "256", "--override-kv", "tokenizer.ggml.add_bos_token=bool:true",
                 "--no-warmup", "--no-watch") as srv:
        meta = httpx.get(srv.url + "/v1/models").json()["data"][0]["meta"]
        assert meta["n_ctx_train"] == 1024
        assert httpx.get(srv.url + "/props").json()["default_generation_settings"]["n_ctx"] == 1024
        ids = httpx.post(srv.url + "/tokenize", json={"content": "hi", "add_special": True}).json()["tokens"]
        assert ids[0] == BOS
        out = httpx.post(srv.url + "/completion", json={"prompt": "hi " * 300, "n_predict": 4, "seed": 1,
                                                         "temperature": 0}).json()
        assert out["timings"]["prompt_n"] > 512 and out["timings"]["predicted_n"] == 4   # past the file's 512
    assert "rope from the command line: kind yarn" in (tmp_path / "server.log").read_text()


CVEC = Path(__file__).parent / "fixtures" / "control" / "cvec_a.gguf"   # width 32, direction.1-5


def test_control_vector_flags_parse_as_llama_server_spells_them():
    args = parse("-m", str(TINY), "--control-vector", f"{CVEC},{CVEC}", "--control-vector-scaled", f"{CVEC}:-0.5",
                 "--control-vector-layer-range", "1", "3")
    model = plan_from_args(args).model
    assert model.control_vectors == ((CVEC, 1.0), (CVEC, 1.0), (CVEC, -0.5)) and model.control_layers == (1, 3)
    with pytest.raises(ConfigError, match="--control-vector-scaled format: FNAME:SCALE"):
        plan_from_args(parse("-m", str(TINY), "--control-vector-scaled", str(CVEC)))
    with pytest.raises(ConfigError, match="control vector /nope.gguf: no such file"):
        plan_from_args(parse("-m", str(TINY), "--control-vector", "/nope.gguf"))


def test_control_vectors_are_summed_scaled_and_kept_to_their_layers():
    one = load_control(((CVEC, 1.0),), None, 5, 32)
    both = load_control(((CVEC, 1.0), (CVEC, -0.5)), (2, 3), 5, 32)
    assert sorted(one) == [1, 2, 3, 4]                       # layer 0 never, direction.5 past the last layer
    assert sorted(both) == [2, 3] and torch.equal(both[2], one[2] * 0.5)
    assert sorted(load_control(((CVEC, 1.0),), (0, 0), 5, 32)) == [1, 2, 3, 4]   # <= 0: llama.cpp's defaults


@pytest.mark.parametrize("tensors, words", [
    ({"direction.0": np.ones(32, np.float32)}, "not direction.N with a layer N >= 1"),
    ({"dir.1": np.ones(32, np.float32)}, "not direction.N"),
    ({"direction.1": np.ones((2, 16), np.float32)}, "must be a 1-D F32 tensor"),
    ({"direction.1": np.ones(32, np.float16)}, "must be a 1-D F32 tensor, got F16"),
    ({"direction.1": np.ones(16, np.float32)}, "directions of width 16, the model's is 32"),
])
def test_a_bad_control_vector_file_stops_loading_naming_it(tmp_path, tensors, words):
    path = write_gguf(tmp_path / "cv.gguf", "controlvector", tensors)
    with pytest.raises(ConfigError, match=None) as e:
        ModelBundle.load(ModelConfig(TINY, control_vectors=((path, 1.0),)))
    assert str(path) in str(e.value) and words in str(e.value)


def test_generate_steered_by_a_control_vector_writes_another_continuation(capsys):
    """The same greedy prompt through `slotserver generate`, with and without a strong vector."""
    def run(*flags: str) -> str:
        assert cli.main(["generate", "-m", str(SMOLLM3), "-n", "8", "--temp", "0", "--dtype", "float32",
                         *flags, "hello"]) == 0
        return capsys.readouterr().out
    plain, steered = run(), run("--control-vector-scaled", f"{CVEC}:8")
    assert plain != steered and plain == run()


def test_a_steered_models_decode_steps_replay_exactly():
    """The control vector's add is one C call, so a captured step graph replays it: decode steps of
    the default model (its GGUF blocks) with and without step graphs give the same logits, bit for bit."""
    rows = [{"prompt_ids": [1, 2, 3], "generated_ids": list(range(100, 108))} for _ in range(3)]
    out = []
    for graphs in (True, False):
        model = LlamaModel.load(default_model_path(), torch.float32, max_pos=64, fmt=WeightFormat("q"))
        model.control = {i: torch.full((model.spec.d_model,), 0.05) for i in range(1, model.spec.n_layers)}
        model.set_step_graphs(graphs)
        for _ in range(2):   # the first pass captures, the second replays
            logits = torch.stack(_decoded(model, rows, "seq_head_dim"))
        if graphs and not (model.graphs and model.graphs.graphs):
            pytest.skip("no step graph captured here (SLOTSERVER_NATIVE=0 or no compiler)")
        out.append(logits)
    assert torch.equal(out[0], out[1])
