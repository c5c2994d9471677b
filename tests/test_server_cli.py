"""`slotserver serve` flags: llama-server's spellings (with `_` or `-`), and one-line errors, exit 2.

Flag parsing and start-up checks run in-process (they fail before anything is loaded); a model
that fails to load runs the real process, since that failure happens after the port is bound.
"""

from __future__ import annotations

import gc
import socket
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from slotserver.cli import main as cli
from slotserver.cli.serve import normalize_argv
from slotserver.model.config import DEFAULT_LAYOUT
from slotserver.server import launch
from slotserver.server.config_from_args import plan_from_args, server_config_from_args


def parse(*argv: str):
    return cli.build_parser().parse_args(["serve", *argv])


def run_cli(capsys, *argv: str, start: bool = False) -> tuple[int, list[str]]:
    """Exit status and stderr lines of `slotserver serve ARGV` run in-process. Unless `start`, a
    command line that gets as far as serving fails at once: a test of a refused flag whose flag
    became valid would otherwise serve on port 8080 until the suite's timeout."""
    def refuse(*_args):
        raise AssertionError(f"`serve {' '.join(argv)}` was accepted and would start a server")
    try:
        with mock.patch.object(launch, "serve", launch.serve if start else refuse):
            status = cli.main(["serve", *argv])
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err.strip().splitlines()


def test_underscores_in_long_flags_count_as_dashes():
    assert normalize_argv(["--ctx_size", "2048", "--api_key=a_b", "-np", "4", "some_value"]) == \
        ["--ctx-size", "2048", "--api-key=a_b", "-np", "4", "some_value"]


def test_llama_server_flags_reach_the_configs(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("k2\n\n  k3  \n")
    args = parse("--ctx_size", "1024", "-np", "2", "-b", "256", "-ub", "128", "-n", "32", "--temp", "0.2",
                 "--seed", "9", "--api-key", "k1", "--api-key-file", str(keys), "--no-slots", "--no_cache_prompt",
                 "-sps", "0.5", "--cors", "http://ui", "--alias", "smol", "--slot-save-path", str(tmp_path / "s"),
                 "--defrag", "off", "--no-context-shift", "--jinja", "--timeout", "30", "--slots-debug", "--metrics",
                 "--no-warmup")
    config, plan = server_config_from_args(args), plan_from_args(args)
    assert config.api_keys == ("k1", "k2", "k3") and config.cors.origins == ("http://ui",)
    assert not config.slots_endpoint and config.slots_debug and config.metrics and config.timeout == 30
    assert config.model_name == "smol" and (tmp_path / "s").is_dir()
    d = config.defaults
    assert (d.n_predict, d.temperature, d.seed, d.cache_prompt) == (32, 0.2, 9, False)
    e = plan.engine
    assert (e.n_parallel, e.ctx_size, e.n_cells, e.batch_size, e.ubatch_size) == (2, 1024, 512, 256, 128)
    assert (e.defrag, e.slot_prompt_similarity, e.cache_prompt) == ("off", 0.5, False)
    assert (e.context_shift, e.cache_reuse) == (False, 0)
    e = plan_from_args(parse("--context-shift", "--cache-reuse", "256")).engine
    assert (e.context_shift, e.cache_reuse) == (True, 256)
    assert (plan.host, plan.port, plan.model.max_ctx) == ("127.0.0.1", 8080, 512) and not plan.warmup


def test_defaults_match_llama_server():
    args = parse()
    config, plan = server_config_from_args(args), plan_from_args(args)
    assert (plan.host, plan.port, plan.engine.ctx_size, plan.engine.n_parallel) == ("127.0.0.1", 8080, 4096, 4)
    assert config.slots_endpoint and not config.metrics and not config.api_keys and not config.cors.origins
    assert not config.slots_debug and plan.chat_template is None and plan.watch and plan.warmup
    assert plan.model.layout == DEFAULT_LAYOUT   # the CLI's default is the library's


def test_chat_template_by_name_or_source():
    assert "<|im_start|>" in plan_from_args(parse("--chat-template", "chatml")).chat_template
    source = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert plan_from_args(parse("--chat_template", source)).chat_template == source


@pytest.mark.parametrize("argv, words", [
    (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    (["-mm", "mmproj.gguf"], "-mm: multimodal (image, audio, video) input is not supported here"),
    (["-zz", "1"], "unrecognized arguments: -zz"),   # a single-dash flag no server has
    (["-n32"], "unrecognized arguments: -n32"),
    (["--port", "abc"], "invalid int value"),
    (["--defrag", "maybe"], "invalid choice"),
    (["--cache-reuse", "-1"], "--cache-reuse must be an integer >= 0"),
    (["--context-shift", "-c", "8", "-np", "2"], "--context-shift needs slots of more than 4 cells"),
    (["--chat-template", "no-such-template"], "neither a known name"),
    (["--chat-template", "{% if %}"], "chat template syntax error"),
    (["-np", "0"], "--parallel must be a positive integer"),
    (["-c", "2", "-np", "4"], "smaller than --parallel"),
    (["--port", "70000"], "--port must be in [0, 65535]"),
    (["-m", "/no/such/model.gguf"], "not found"),
    (["-m", "/"], "model / is a directory: give a GGUF file"),
    (["--api-key-file", "/no/such/keys.txt"], "--api-key-file"),
])
def test_bad_flags_are_one_line_and_exit_2(capsys, argv, words):
    status, lines = run_cli(capsys, *argv)
    assert status == 2 and len(lines) == 1 and words in lines[0], lines


def test_a_busy_port_is_one_line_and_exit_2(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        status, lines = run_cli(capsys, "--port", str(s.getsockname()[1]), start=True)
    assert status == 2 and len(lines) == 1 and "cannot listen on 127.0.0.1:" in lines[0]
    assert gc.isenabled(), "serve paused the garbage collector for start-up and left it off"


def test_a_broken_model_file_stops_the_server_with_one_line(tmp_path: Path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    cmd = [sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(bad), "--port", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 2 and len(errors) == 1 and "broken.gguf" in errors[0], done.stderr


def test_dtype_help_says_what_the_config_does(tmp_path, monkeypatch, capsys):
    """`serve --help` once said auto meant bfloat16 on AVX512-BF16/AMX CPUs, while the GGUF blocks
    (the default weights) keep float32 everywhere: the help's claims, checked on both kinds of CPU."""
    from slotserver.runtime import cpu_features
    from slotserver.model.config import ModelConfig
    import torch

    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "auto (default): float32 with the GGUF blocks (the default --weights, and q)" in help_text
    assert "with dequantized --weights (dense, int8, int4, auto8, auto4) bfloat16 where the CPU computes it " \
           "natively (AVX512-BF16/AMX), else float32" in help_text
    assert "float32: with --weights auto, the exact dequantized reference mode" in help_text
    model = tmp_path / "m.gguf"
    for variant, extra, native in (("amx", cpu_features.AMX, True), ("avx2", frozenset(), False)):
        cpu = cpu_features.CpuFeatures(variant, frozenset({"avx512_bf16"} if native else set()) | extra)
        monkeypatch.setattr(cpu_features, "current", lambda env=None, cpu=cpu: cpu)
        assert ModelConfig(model, dtype="auto").weight_format.kind == "q"
        assert ModelConfig(model, dtype="auto").torch_dtype == torch.float32
        assert ModelConfig(model, dtype="auto", weights="q").torch_dtype == torch.float32
        want = torch.bfloat16 if native else torch.float32
        assert all(ModelConfig(model, dtype="auto", weights=w).torch_dtype == want
                   for w in ("dense", "int8", "int4", "auto8", "auto4")), variant
        assert ModelConfig(model, dtype="float32").weight_format.kind == "dense"


def test_flags_sharing_a_setting_agree_on_its_default():
    """argparse takes a shared setting's default from the first flag added: a second spelling added
    first (`--warmup` before `--no-warmup`) would silently flip it for everyone."""
    for name, sub in cli.build_parser()._subparsers._group_actions[0].choices.items():
        first: dict = {}
        for action in sub._actions:
            default = first.setdefault(action.dest, action.default)   # the first flag's, None included
            assert action.default is None or default == action.default, (name, action.option_strings)
