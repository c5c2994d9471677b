"""Router mode's parts without processes: the LRU queue's rules (llama-server's server_lru_sched),
the preset INI and the model catalog, the hub cache's names, the flags children get, and the
merged /metrics text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from slotserver.cli.main import build_parser, main
from slotserver.cli.llama_env import env_flags
from slotserver.cli.router_args import flag_table, passthrough_argv, router_config
from slotserver.errors import ConfigError
from slotserver.hub import cache as hub_cache
from slotserver.router.catalog import build_catalog
from slotserver.router.child_args import child_argv
from slotserver.router.config import RouterConfig
from slotserver.router.listing import preset_ini, shown_args
from slotserver.router.preset_ini import flag_for
from slotserver.router.events import Events
from slotserver.router.instance import LOADED, UNLOADED, Instance
from slotserver.router.metrics import merge
from slotserver.router.sched import LruSched

COMMIT = "0" * 40


def _serve_parser():
    sub = build_parser()._subparsers._group_actions[0]
    return sub.choices["serve"]


FLAGS = flag_table(_serve_parser())


def _sched(models_max: int, **status: str) -> tuple[LruSched, list[str], dict[str, Instance]]:
    stopped: list[str] = []
    insts = {n: Instance(n, status=s, last_used=i) for i, (n, s) in enumerate(status.items())}

    def stop(name):
        insts[name].stopping = True
        stopped.append(name)
    return LruSched(insts, models_max, stop), stopped, insts


def test_eviction_takes_the_least_recently_used_idle_model_never_a_busy_one():
    sched, stopped, insts = _sched(2, a=LOADED, b=LOADED, c=UNLOADED)
    insts["a"].req_count = 1   # a is older but serving a request
    sched.join("c")
    sched.tick()
    assert stopped == ["b"]
    sched.tick()               # b is already stopping: counted as freeing, nobody else goes
    assert stopped == ["b"]


def test_requests_for_one_model_share_one_entry_and_one_eviction():
    sched, stopped, _ = _sched(2, a=LOADED, b=LOADED, c=UNLOADED)
    for _ in range(3):
        sched.join("c")
        sched.tick()
    assert [(e.model, e.waiters) for e in sched.queue] == [("c", 3)]
    assert stopped == ["a"]


def test_queue_is_fifo_and_a_model_a_waiter_wants_is_kept():
    sched, stopped, insts = _sched(1, a=LOADED, b=UNLOADED, c=UNLOADED)
    sched.join("b")
    sched.join("c")
    assert not sched.try_claim("b")          # no slot free yet
    sched.tick()
    assert stopped == ["a"]
    insts["a"].status, insts["a"].stopping = UNLOADED, False
    assert not sched.try_claim("c")          # c is behind b
    assert sched.try_claim("b") and not sched.try_claim("b")   # one loader per entry
    insts["b"].status = LOADED
    sched.tick()
    assert stopped == ["a"], "b is loaded for a waiter still queued: it must not be evicted"
    sched.leave("b")
    sched.tick()
    assert stopped == ["a", "b"]


def test_a_waiter_that_leaves_frees_its_claim():
    sched, stopped, _ = _sched(1, a=LOADED, b=UNLOADED)
    sched.join("b")
    sched.leave("b")
    sched.tick()
    assert sched.queue == [] and stopped == []


def _hub(root: Path, repo: str, *files: str) -> Path:
    snap = root / f"models--{repo.replace('/', '--')}" / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (root / f"models--{repo.replace('/', '--')}" / "refs").mkdir()
    (root / f"models--{repo.replace('/', '--')}" / "refs" / "main").write_text(COMMIT)
    for f in files:
        (snap / f).write_bytes(b"GGUF")
    return snap


def test_hub_cache_names_and_resolution_follow_llama_cpp(tmp_path):
    snap = _hub(tmp_path, "org/m-GGUF", "m-Q8_0.gguf", "m-q4_k_m.gguf", "mmproj-m-F16.gguf",
                "big-Q2_K-00001-of-00002.gguf", "big-Q2_K-00002-of-00002.gguf")
    assert hub_cache.list_models(tmp_path) == {"org/m-GGUF:Q8_0": snap / "m-Q8_0.gguf",
                                               "org/m-GGUF:Q4_K_M": snap / "m-q4_k_m.gguf",
                                               "org/m-GGUF:Q2_K": snap / "big-Q2_K-00001-of-00002.gguf"}
    assert hub_cache.resolve(tmp_path, "org/m-GGUF") == snap / "m-q4_k_m.gguf"   # Q4_K_M by default
    assert hub_cache.resolve(tmp_path, "org/m-GGUF:q8_0") == snap / "m-Q8_0.gguf"
    with pytest.raises(ConfigError, match="org/other.*not in the models cache"):
        hub_cache.resolve(tmp_path, "org/other")


def test_a_split_model_in_the_models_dir_is_listed_once(tmp_path):
    """llama-server lists every top-level GGUF; a split model's later parts cannot load on their own,
    so only its first part is listed (under llama-server's name for it), as in a model's folder."""
    from slotserver.router.catalog import scan_models_dir
    for name in ("big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "small.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    (tmp_path / "sub").mkdir()
    for name in ("q-00001-of-00002.gguf", "q-00002-of-00002.gguf"):
        (tmp_path / "sub" / name).write_bytes(b"GGUF")
    found = {name: e.path.name for name, e in scan_models_dir(tmp_path).items()}
    assert found == {"big-00001-of-00002": "big-00001-of-00002.gguf", "small": "small.gguf",
                     "sub": "q-00001-of-00002.gguf"}


def test_a_split_model_missing_a_part_is_neither_listed_nor_resolved(tmp_path):
    """A download stopped between parts: its first part alone would not load."""
    snap = _hub(tmp_path, "org/s-GGUF", "s-Q2_K-00001-of-00003.gguf", "s-Q2_K-00003-of-00003.gguf")
    assert hub_cache.list_models(tmp_path) == {}
    with pytest.raises(ConfigError, match="not in the models cache"):
        hub_cache.resolve(tmp_path, "org/s-GGUF:Q2_K")
    (snap / "s-Q2_K-00002-of-00003.gguf").write_bytes(b"GGUF")
    assert hub_cache.list_models(tmp_path) == {"org/s-GGUF:Q2_K": snap / "s-Q2_K-00001-of-00003.gguf"}
    assert hub_cache.resolve(tmp_path, "org/s-GGUF:Q2_K") == snap / "s-Q2_K-00001-of-00003.gguf"


def test_preset_options_cascade_and_render_as_child_flags(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "local.gguf").write_bytes(b"GGUF")
    snap = _hub(tmp_path / "hub", "org/m-GGUF", "m-Q8_0.gguf")
    ini = tmp_path / "p.ini"
    ini.write_text("version = 1\n[*]\nc = 1024\nnp = 3\n\n[local]\nctx-size = 512\ncache-prompt = false\n"
                   "[mine]\nhf-repo = org/m-GGUF:Q8_0\nLLAMA_ARG_N_PREDICT = 7\nload-on-startup = true\n"
                   "dedup-cache-models = 1\n[ghost]\nhf-repo = org/none\n")
    config = RouterConfig(models_dir=tmp_path / "dir", models_preset=ini, models_cache=tmp_path / "hub",
                          child_argv=("-np", "2"), child_env_argv=("--temp=0.5", "--ctx-size=64"),
                          child_command=("slotserver", "serve"))
    cat = build_catalog(config, FLAGS)
    assert cat["local"].options == {"--ctx-size": "512", "--parallel": "3", "--cache-prompt": "false"}
    assert cat["mine"].path == snap / "m-Q8_0.gguf" and cat["mine"].load_on_startup
    assert cat["org/m-GGUF:Q8_0"].hidden, "dedup-cache-models hides the cache entry the preset serves"
    assert cat["ghost"].error is None and cat["ghost"].hub == ("org/none", None)   # the child downloads it
    assert child_argv(cat["ghost"], config, FLAGS, 9)[-8:] == ["-hf", "org/none", "--host", "127.0.0.1", "--port",
                                                                "9", "--alias", "ghost"]
    argv = child_argv(cat["local"], config, FLAGS, 1234)
    # the router's variables, then the preset (which overrides them), then the router's command line
    assert argv == ["slotserver", "serve", "--temp=0.5", "--ctx-size=64", "--ctx-size", "512", "--parallel", "3",
                    "--no-cache-prompt", "-np", "2", "--model", str(tmp_path / "dir" / "local.gguf"),
                    "--host", "127.0.0.1", "--port", "1234", "--alias", "local"]


def test_preset_variable_keys_name_flags_through_llama_cpps_table():
    flags = {**FLAGS, **env_flags(FLAGS)}   # as cli/router_args.py builds it
    assert flag_for("LLAMA_ARG_N_PARALLEL", flags) == "--parallel"   # not "--n-parallel"
    assert flag_for("LLAMA_ARG_ENDPOINT_METRICS", flags) == "--metrics"
    assert flag_for("LLAMA_ARG_NO_UI", flags) == "--no-ui"   # llama-server's own name (--no-webui is older)


def test_an_unknown_preset_key_is_refused_by_name(tmp_path):
    ini = tmp_path / "p.ini"
    ini.write_text("[m]\nmodel = /x.gguf\nno-such-flag = 1\n")
    with pytest.raises(ConfigError, match="'no-such-flag' not recognized in preset 'm'"):
        build_catalog(RouterConfig(models_preset=ini), FLAGS)


def test_children_get_the_routers_flags_but_not_the_ones_it_owns():
    argv = ["--port", "9", "-c", "2048", "--api-key=k", "--models-dir", "/m", "--no-models-autoload",
            "--temp", "0", "--host", "0.0.0.0", "--models-max", "2", "--cors", "*", "--cors-headers=x",
            "--no-cors-credentials", "--metrics"]   # the router answers CORS itself
    assert passthrough_argv(argv, FLAGS) == ["-c", "2048", "--temp", "0", "--metrics"]


def test_metrics_merge_keeps_families_together_with_a_model_label():
    a = "# HELP x_total X\n# TYPE x_total counter\nx_total 3\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
    b = "# HELP x_total X\n# TYPE x_total counter\nx_total 5\n"
    assert merge({"a": a, "b": b}).splitlines() == [
        "# HELP x_total X", "# TYPE x_total counter", 'x_total{model="a"} 3', 'x_total{model="b"} 5',
        "# TYPE h histogram", 'h_bucket{model="a",le="1"} 2']


def test_a_bad_preset_stops_the_router_with_one_line(tmp_path, capsys):
    ini = tmp_path / "p.ini"
    ini.write_text("[m]\nmodel = /x.gguf\nctx-size\n")
    assert main(["serve", "--models-preset", str(ini), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"slotserver: error: --models-preset {ini}: line 3: 'ctx-size' is not `key = value`"
    assert main(["serve", "--models-dir", str(tmp_path), "-m", "x.gguf"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    assert main(["serve", "--models-dir", str(tmp_path), "-hf", "org/m-GGUF"]) == 2   # each child would get it
    assert "exclude each other" in capsys.readouterr().err


def test_a_hub_preset_keeps_its_identity_once_downloaded_and_its_token_stays_hidden(tmp_path):
    """A reload after the child downloaded the model must not unload it (the reference, not the path,
    is what a preset names); the token reaches children in their environment, and /models' listing
    of a command line hides secret values."""
    ini = tmp_path / "p.ini"
    ini.write_text("version = 1\n[m]\nhf-repo = org/m-GGUF:Q8_0\nhf-token = secret1\n")
    (tmp_path / "hub").mkdir()
    config = RouterConfig(models_preset=ini, models_cache=tmp_path / "hub", child_command=("slotserver", "serve"))
    before = build_catalog(config, FLAGS)["m"]
    assert before.path is None and "-hf" in child_argv(before, config, FLAGS, 9)
    snap = _hub(tmp_path / "hub", "org/m-GGUF", "m-Q8_0.gguf")   # what the child's download leaves
    after = build_catalog(config, FLAGS)["m"]
    assert after.path == snap / "m-Q8_0.gguf" and after.fingerprint() == before.fingerprint()
    assert shown_args(["serve", "--hf-token", "secret1", "--api-key=k", "-c", "8"]) == [
        "serve", "--hf-token", "(hidden)", "--api-key=(hidden)", "-c", "8"]
    assert "secret1" not in preset_ini(after)
    parser = build_parser()
    args = parser.parse_args(["serve", "--models-preset", str(ini), "-hft", "secret2"])
    config, _ = router_config(args, args.serve_parser)
    assert config.extra_env == {"HF_TOKEN": "secret2"} and "secret2" not in " ".join(config.child_argv)


def test_sse_subscribers_get_each_event_once_subscribed():
    async def run():
        events = Events()
        stream = events.stream()
        assert await stream.__anext__() == b": connected\n\n"   # subscribed from here on
        events.publish("model_status", "a", {"status": "loading"})
        events.publish("models_reload", "*")
        got = [await stream.__anext__(), await stream.__anext__()]
        await stream.aclose()
        assert events.subscribers == set()
        return got
    first, second = asyncio.run(run())
    assert json.loads(first[6:]) == {"model": "a", "event": "model_status", "data": {"status": "loading"}}
    assert json.loads(second[6:]) == {"model": "*", "event": "models_reload"}
