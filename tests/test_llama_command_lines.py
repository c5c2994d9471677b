"""llama-server command lines and environments start slotserver unchanged: its machinery flags are
taken and named at start-up, `-ngl 0` keeps the CPU, LLAMA_ARG_* variables stand for their flags
(the command line wins), `--api-key` lists and key-file comments read as llama-server reads them.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient
from test_server_cli import parse, run_cli
from test_server_e2e import serving

from slotserver.access.api_keys import flag_keys, read_key_file
from slotserver.access.listen import bind
from slotserver.cli.placement_args import parse_mask, parse_range
from slotserver.errors import ConfigError
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.config_from_args import plan_from_args, server_config_from_args

TINY = Path(__file__).parent / "fixtures" / "archs" / "llama3_freqs.gguf"
# Qwen2.5's model card, as llama-server users run it
MODEL_CARD = ("-ngl", "99", "-c", "2048", "--host", "127.0.0.1", "-fa", "on", "--mlock", "--no-mmap", "-cb",
              "--threads-http", "4", "--temp", "0.7", "--top-p", "0.8", "--top-k", "20", "--min-p", "0",
              "--repeat-penalty", "1.05", "-s", "3", "--numa", "distribute", "-nkvo", "-lv", "3")


def test_a_model_cards_command_line_parses_into_the_settings_it_names():
    args = parse(*MODEL_CARD)
    config, plan = server_config_from_args(args), plan_from_args(args)
    assert config.defaults.fields == {"top_p": 0.8, "top_k": 20, "min_p": 0.0, "repeat_penalty": 1.05}
    assert (config.defaults.temperature, config.defaults.seed, plan.engine.ctx_size) == (0.7, 3, 2048)
    assert plan.model.device == "auto"
    assert [n.split(" (")[0] for n in args.no_effect] == [
        "--mlock", "--no-mmap", "-cb", "--threads-http 4", "--numa distribute", "-nkvo", "-lv 3"]
    assert plan_from_args(parse("-ngl", "0")).model.device == "cpu"   # no layer offloaded: the CPU


def test_continuous_batching_cannot_be_turned_off(capsys):
    status, err = run_cli(capsys, "-nocb")
    assert status == 2 and len(err) == 1 and "-nocb" in err[0] and "continuous batching" in err[0]


def test_llama_arg_variables_stand_for_flags_and_the_command_line_wins(monkeypatch, capsys):
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "1024")
    monkeypatch.setenv("LLAMA_ARG_NO_CONTEXT_SHIFT", "1")
    monkeypatch.setenv("LLAMA_ARG_ENDPOINT_METRICS", "on")
    monkeypatch.setenv("LLAMA_ARG_TOP_K", "7")
    monkeypatch.setenv("LLAMA_ARG_PORT", "9000")
    args = parse("--port", "9001")
    assert (args.ctx_size, args.context_shift, args.metrics, args.port) == (1024, False, True, 9001)
    assert args.request_fields == {"top_k": 7}
    monkeypatch.setenv("LLAMA_ARG_ENDPOINT_METRICS", "maybe")
    status, err = run_cli(capsys)
    assert status == 2 and len(err) == 1 and "LLAMA_ARG_ENDPOINT_METRICS='maybe'" in err[0]
    monkeypatch.setenv("LLAMA_ARG_ENDPOINT_METRICS", "off")
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "big")   # a bad value: the error names the variable
    status, err = run_cli(capsys)
    assert status == 2 and len(err) == 1 and "LLAMA_ARG_CTX_SIZE='big'" in err[0], err
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "1024")
    monkeypatch.setenv("LLAMA_ARG_MMPROJ", "/m/mmproj.gguf")
    status, err = run_cli(capsys)
    assert status == 2 and len(err) == 1 and "LLAMA_ARG_MMPROJ" in err[0] and "--mmproj" in err[0]


def test_repeatable_flags_on_the_command_line_replace_their_variable(monkeypatch):
    monkeypatch.setenv("LLAMA_API_KEY", "-e1,e2")   # a key may start with a dash
    monkeypatch.setenv("LLAMA_ARG_CORS_ORIGINS", "http://env.example")
    assert server_config_from_args(parse()).api_keys == ("-e1", "e2")
    config = server_config_from_args(parse("--api-key", "c", "--cors", "http://cli.example"))
    assert config.api_keys == ("c",) and config.cors.origins == ("http://cli.example",)


def test_llama_server_values_of_device_and_flash_attn_variables(monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_DEVICE", "none")   # llama-server's -dev: no GPU
    monkeypatch.setenv("LLAMA_ARG_FLASH_ATTN", "1")
    assert plan_from_args(parse()).model.device == "cpu"


@pytest.mark.parametrize("value", ["", " , "])
def test_an_empty_api_key_stops_the_server_rather_than_open_it(monkeypatch, capsys, value):
    monkeypatch.setenv("LLAMA_API_KEY", value)   # an unset ${KEY} in a compose file
    status, err = run_cli(capsys)
    assert status == 2 and len(err) == 1 and "LLAMA_API_KEY" in err[0], err
    status, err = run_cli(capsys, "--api-key", value)
    assert status == 2 and len(err) == 1 and "holds no key" in err[0], err


@pytest.mark.parametrize("name, value, words", [
    ("LLAMA_ARG_HOST", "", "LLAMA_ARG_HOST is set but empty"),   # would listen on every interface
    ("LLAMA_ARG_MODELS_DIR", "", "LLAMA_ARG_MODELS_DIR is set but empty"),
    ("LLAMA_ARG_DEVICE", "CUDA1", "CUDA_VISIBLE_DEVICES"),
    ("LLAMA_ARG_CONT_BATCHING", "0", "LLAMA_ARG_CONT_BATCHING='0' (llama-server's --no-cont-batching): continuous batching")])
def test_variables_that_cannot_be_honoured_are_one_line_naming_them(monkeypatch, capsys, name, value, words):
    monkeypatch.setenv(name, value)
    status, err = run_cli(capsys)
    assert status == 2 and len(err) == 1 and words in err[0], err


def test_a_bare_flash_attn_flag_as_older_model_cards_write_it():
    assert parse("-fa").flash_attn == "on"


def test_api_key_lists_and_key_file_comments_as_llama_server_reads_them(tmp_path):
    assert flag_keys(["k1,k2", ' a , "b,c"']) == ["k1", "k2", "a", "b,c"]
    keys = tmp_path / "keys"
    keys.write_text("# the team's keys\nk3\n  # old: k0\n\nk4\n")
    assert read_key_file(keys) == ["k3", "k4"]


def test_a_llama_server_docker_setup_serves(tmp_path, monkeypatch):
    """Environment as in llama-server's Docker docs, machinery flags on the command line: the server
    answers with those settings and says once which flags had no effect."""
    keys = tmp_path / "keys"
    keys.write_text("# team\nk3\n")
    for name, value in {"LLAMA_ARG_CTX_SIZE": "512", "LLAMA_API_KEY": "k1,k2", "LLAMA_ARG_TOP_K": "1",
                        "LLAMA_ARG_N_PARALLEL": "2", "LLAMA_ARG_N_GPU_LAYERS": "99"}.items():
        monkeypatch.setenv(name, value)
    log = tmp_path / "llama.log"
    with serving(tmp_path, "-m", str(TINY), "--mlock", "--threads-http", "8", "--api-key-file", str(keys),
                 "--log-file", str(log), "--no-warmup", "--no-watch") as srv:
        for key in ("k1", "k2", "k3"):
            props = httpx.get(srv.url + "/props", headers={"Authorization": f"Bearer {key}"}).json()
            assert props["default_generation_settings"]["params"]["top_k"] == 1, key
        assert httpx.get(srv.url + "/props", headers={"Authorization": "Bearer # team"}).status_code == 401
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 256   # 512 / 2 slots
    text = log.read_text()
    assert "llama-server flags with no effect here: --mlock (" in text and "--threads-http 8 (" in text
    assert "from llama-server's environment variables: " in text and "LLAMA_API_KEY=(set)" in text
    assert "LLAMA_ARG_CTX_SIZE=512" in text and "k1,k2" not in text


def test_more_machinery_flags_are_taken_and_named_and_a_reverse_prompt_is_the_default_stop():
    args = parse("--prio", "2", "-dt", "0.1", "-Cb", "0xf", "--poll", "50", "-lm", "mmap", "-fitt", "1024",
                 "-td", "4", "-p", "hello", "--no-mmproj", "-e", "-r", "User:", "-r", "###", "-ctkd", "q8_0",
                 "--spec-ngram-map-k-size-n", "3")
    assert [n.split(" (")[0] for n in args.no_effect] == [
        "--prio 2", "-dt 0.1", "-Cb 0xf", "--poll 50", "-lm mmap", "-fitt 1024", "-td 4", "-p hello", "--no-mmproj", "-e",
        "-ctkd q8_0", "--spec-ngram-map-k-size-n 3"]
    assert server_config_from_args(args).defaults.fields == {"stop": ["User:", "###"]}


@pytest.mark.parametrize("flags, words", [
    (("-mu", "https://example.com/m.gguf"), "only -hf USER/MODEL[:QUANT] downloads here"),
    (("--fim-qwen-7b-default",), "only -hf"),
    (("--mmproj", "p.gguf"), "multimodal"), (("--rpc", "host:50052"), "no RPC backends"),
    (("--tools", "all"), "no built-in tools"),
    (("--kv-unified-per-slot", "4096"), "no per-slot cap"),
    (("--spec-ngram-size-n", "3"), "removed from llama.cpp too"), (("--completion-bash",), "no shell completion"),
])
def test_flags_of_features_this_server_lacks_stop_it_with_the_reason(capsys, flags, words):
    status, err = run_cli(capsys, *flags)
    assert status == 2 and len(err) == 1 and flags[0] in err[0] and words in err[0]


def test_cpu_masks_and_ranges_read_as_llama_cpp_reads_them(capsys):
    assert (parse_mask("0x5"), parse_mask("ff0"), parse_mask("0")) == ({0, 2}, set(range(4, 12)), set())
    assert (parse_range("2-4"), parse_range("-1", 8), parse_range("6-", 8)) == ({2, 3, 4}, {0, 1}, {6, 7})
    for flags in (("-C", "0xzz"), ("-Cr", "4-2"), ("-Cr", "3")):
        status, err = run_cli(capsys, *flags)
        assert status == 2 and len(err) == 1 and flags[0] in err[0]


def test_list_devices_and_version_answer_and_exit(capsys):
    for flag, words in (("--list-devices", "Available devices:\n  cpu: "), ("--version", "slotserver ")):
        with pytest.raises(SystemExit) as stop:
            parse(flag)
        assert stop.value.code == 0 and capsys.readouterr().out.startswith(words)


def test_reuse_port_lets_two_sockets_bind_one_port():
    first = bind("127.0.0.1", 0, reuse_port=True)
    port = first.getsockname()[1]
    try:
        bind("127.0.0.1", port, reuse_port=True).close()
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind("127.0.0.1", port)
    finally:
        first.close()


def test_static_files_ui_settings_props_and_cpu_mask_through_a_server(tmp_path):
    """--path serves a folder at /, --ui-config shows in /props, POST /props answers only with --props
    (and names a property it cannot change), -C keeps the server on the CPUs of its mask."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<p>our own page</p>")
    (site / "app.js").write_text("let x = 1;")
    cpu = min(os.sched_getaffinity(0))   # one this test may use (xdist workers may be pinned)
    with serving(tmp_path, "-m", str(TINY), "-c", "256", "-np", "1", "--path", str(site), "--ui-config",
                 '{"theme": "dark"}', "--props", "-C", hex(1 << cpu), "--no-warmup", "--no-watch") as srv:
        assert httpx.get(srv.url + "/").text == "<p>our own page</p>"
        assert httpx.get(srv.url + "/app.js").text == "let x = 1;"
        assert httpx.get(srv.url + "/health").json() == {"status": "ok"}     # the API still answers
        props = httpx.get(srv.url + "/props").json()
        assert props["ui_settings"] == {"theme": "dark"} and props["endpoint_props"] is True
        assert httpx.post(srv.url + "/props", json={}).json() == {"success": True}
        assert httpx.post(srv.url + "/props").json() == {"success": True}          # no body, as llama-server
        r = httpx.post(srv.url + "/props", json={"n_ctx": 8})
        assert r.status_code == 400 and "'n_ctx'" in r.json()["error"]["message"]
        status = Path(f"/proc/{srv.proc.pid}/status").read_text()
        assert f"Cpus_allowed_list:\t{cpu}\n" in status
    with serving(tmp_path, "-m", str(TINY), "-c", "256", "-np", "1", "--no-warmup", "--no-watch") as srv:
        r = httpx.post(srv.url + "/props", json={})
        assert r.status_code == 501 and "--props" in r.json()["error"]["message"]


def test_aliases_and_tags_as_llama_server_takes_them():
    """`-a zeta,alpha`: both names retrieve the model, the first in sorted order is its id (llama-server's
    std::set); `--tags` are listed."""
    config = server_config_from_args(parse("-m", str(TINY), "-a", "zeta, alpha,", "-a", "mid", "--tags", "small,chat",
                                           "--tags", "chat"))
    assert (config.model_name, config.aliases, config.tag_list) == ("alpha", ["alpha", "mid", "zeta"], ["chat", "small"])
    assert config.knows_model("zeta") and config.knows_model("alpha") and not config.knows_model("beta")
    assert server_config_from_args(parse("-m", str(TINY))).model_name == TINY.name


def test_llama_servers_other_spellings_of_our_flags():
    args = parse("-dev", "none", "--predict", "5", "--no-ui", "-to", "30", "--log-verbose", "-no-kvu", "--warmup")
    assert (args.device, args.n_predict, args.webui, args.timeout, args.verbose, args.kv_unified, args.no_warmup) \
        == ("cpu", 5, False, 30.0, True, False, False)
    assert parse("-dev", "CUDA0").device == "cuda" and parse("--ui").webui is True
    assert [parse("--device", d).device for d in ("cuda", "cpu", "auto", "none")] == ["cuda", "cpu", "auto", "cpu"]
    plain = parse()   # the second spellings leave the defaults alone
    assert (plain.webui, plain.no_warmup, plain.kv_unified, plain.device) == (True, False, False, "auto")


def test_spec_default_is_llama_servers_ngram_mod_setting():
    spec = plan_from_args(parse("--spec-type", "ngram-simple", "--spec-default", "--spec-ngram-mod-n-max", "80")).engine.spec
    assert (spec.types, spec.ngram_mod_n_match, spec.ngram_mod_n_min, spec.ngram_mod_n_max) == (
        ("ngram-simple", "ngram-mod"), 24, 48, 80)   # added to the types; a later flag still wins
    later = plan_from_args(parse("--spec-default", "--spec-type", "ngram-simple,ngram-mod")).engine.spec
    assert later.types == ("ngram-mod", "ngram-simple")   # --spec-type adds, each type once


def test_static_files_go_with_the_web_page_and_not_without_it(tmp_path):
    """--path replaces the page, and --no-ui turns both off, as llama-server (served while loading too)."""
    (tmp_path / "index.html").write_text("mine")
    for webui, status in ((True, 200), (False, 404)):
        app = create_app(ServerState(ServerConfig(static_path=tmp_path, webui=webui)))
        assert TestClient(app).get("/").status_code == status
