"""The lab imports only modules it lists from its own folders: a request that names a layout or a
file by an absolute path, a `..` path, a name with a separator or a symlink pointing out of the
folder is refused, and the would-be payload never runs (not even in the validation fork).

Each payload writes a sentinel file when imported; the tests assert that the sentinel never
appears and that the answer is a 400 naming the allowed layouts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from starlette.testclient import TestClient
from tiny_gguf import write_tiny_gguf

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.engine.engine import Engine
from slotserver.engine.config import EngineConfig
from slotserver.runtime.loader import ModuleLoadError, default_dir, resolve_in_folder
from slotserver.server import ServerConfig, ServerState, create_app

PAYLOAD = '''import pathlib
pathlib.Path({sentinel!r}).write_text("pwned")
NAME = "evil"
def create(spec):
    raise SystemExit("never get here")
'''


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """A tiny-model server whose lab folders are copies; an outside folder holds the payloads."""
    root = tmp_path_factory.mktemp("labsec")
    kernels, layouts, outside = root / "kernels", root / "layouts", root / "outside"
    shutil.copytree(default_dir("kernels"), kernels)
    shutil.copytree(default_dir("layouts"), layouts)
    outside.mkdir()
    sentinel = root / "SENTINEL"
    for name in ("evil", "seq_head_dim"):
        (outside / f"{name}.py").write_text(PAYLOAD.format(sentinel=str(sentinel)))
    (layouts / "linked.py").symlink_to(outside / "evil.py")
    (kernels / "rms_norm_link.py").symlink_to(outside / "evil.py")
    threads = torch.get_num_threads()
    bundle = ModelBundle.load(ModelConfig(write_tiny_gguf(root / "tiny.gguf"), threads=1,
                                          kernels_dir=kernels, layouts_dir=layouts))
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=128)).start()
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path)))
    state.set_loaded(bundle, engine)
    with TestClient(create_app(state)) as client:
        yield client, root, sentinel
    engine.stop()
    torch.set_num_threads(threads)


def _names(root: Path) -> list[str]:
    outside = root / "outside"
    return [str(outside / "evil"), str(outside / "evil.py"), "../outside/evil", "../../outside/evil",
            f"..{os.sep}outside{os.sep}seq_head_dim", "seq_head_dim/../../outside/evil", "linked",
            "seq_head_dim\n", "seq_head_dim.py", "./seq_head_dim", "", "a" * 5000, "evil\x00"]


def test_layout_switch_by_path_or_odd_name_is_refused_and_runs_nothing(lab_server):
    client, root, sentinel = lab_server
    for name in _names(root):
        r = client.post("/lab/layout", json={"layout": name})
        assert r.status_code == 400, (name, r.status_code, r.text)
        message = r.json()["error"]["message"]
        if name:  # an empty name is "required", the others list what may be named
            assert "seq_head_dim" in message and "head_seq_dim" in message and "paged" in message, message
        assert not sentinel.exists(), f"{name!r} ran the payload"
    layouts = client.get("/lab").json()["layouts"]
    assert "linked" not in layouts and "seq_head_dim" in layouts


def test_reload_of_a_path_outside_the_folders_is_refused_and_runs_nothing(lab_server):
    client, root, sentinel = lab_server
    layouts = root / "layouts"
    paths = [root / "outside" / "evil.py", layouts / ".." / "outside" / "evil.py", layouts / "linked.py",
             root / "kernels" / "rms_norm_link.py", layouts / "sub" / "evil.py", "evil.py", "/etc/passwd"]
    for p in paths:
        r = client.post("/lab/reload", json={"path": str(p)})
        assert r.status_code == 400, (p, r.status_code, r.text)
        assert "not a module the lab lists" in r.json()["error"]["message"]
        assert not sentinel.exists(), f"{p} ran the payload"


def test_a_listed_layout_still_switches(lab_server):
    client, _, sentinel = lab_server
    r = client.post("/lab/layout", json={"layout": "head_seq_dim"})
    assert r.status_code == 200 and r.json()["result"] == "swapped", r.text
    assert client.get("/lab").json()["layout"]["name"] == "head_seq_dim"
    r = client.post("/completion", json={"prompt": "hello", "n_predict": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    assert not sentinel.exists()


def test_the_cli_layout_flag_takes_only_listed_names(tmp_path):
    (tmp_path / "ok.py").write_text("NAME = 'ok'\n")
    (tmp_path / "link.py").symlink_to(tmp_path.parent)
    assert resolve_in_folder(tmp_path, "ok", "layout") == tmp_path / "ok.py"
    for bad in ("link", "../ok", "ok\n", str(tmp_path / "ok"), "ok.py", None, 3):
        with pytest.raises(ModuleLoadError, match="known: ok"):
            resolve_in_folder(tmp_path, bad, "layout")
