"""Random requests at every route of the app never get a 5xx and never write outside the slot folder.

The routes come from the app itself (`create_app(...).routes`), so a new route is fuzzed without
editing this file; only its path parameters need a strategy (`PATH_PARAMS`). Bodies mix every
field name a route knows with hostile values: path-like strings (absolute paths into a temp
folder, `..` climbs, separators), huge and negative numbers, floats, nulls, nested containers,
lone surrogates (sent as JSON `\\udXXX` escapes), and random Content-Types.

The server runs in-process on a tiny model with 32-cell slots, with copies of the lab's folders,
the slot folder and the working directory all inside one temp tree. After every example the tree
outside the slot folder must be unchanged and the lab's payload (a module that writes a sentinel
when imported) must never have run. Hypothesis is derandomized and keeps no database, so a CI
run is reproducible and writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from starlette.routing import Route
from tiny_gguf import write_tiny_gguf

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.engine.engine import Engine
from slotserver.engine.config import EngineConfig
from slotserver.runtime.loader import default_dir
from test_server_api import make_client

N_CELLS = 32
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
PAYLOAD = 'import pathlib\npathlib.Path({sentinel!r}).write_text("pwned")\nNAME = "evil"\n'
FIELDS = ["prompt", "messages", "content", "tokens", "n_predict", "max_tokens", "temperature", "top_k",
          "top_p", "min_p", "seed", "stop", "logit_bias", "n_probs", "id_slot", "stream", "cache_prompt",
          "add_special", "parse_special", "with_pieces", "filename", "layout", "path", "ignore_eos",
          "n_keep", "logprobs", "top_logprobs", "stream_options", "echo", "n", "repeat_penalty",
          "repeat_last_n", "presence_penalty", "frequency_penalty", "return_tokens", "response_format",
          "tools", "input_prefix", "input_suffix", "input_extra", "add_generation_prompt", "role"]
CONTENT_TYPES = ["application/json", "text/plain", "application/x-www-form-urlencoded", None,
                 "application/json; charset=utf-8", "multipart/form-data; boundary=x"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(client, root, sentinel): a tiny-model server whose every folder lies under `root`."""
    root = tmp_path_factory.mktemp("fuzz")
    for sub in ("cwd", "slots", "outside"):
        (root / sub).mkdir()
    shutil.copytree(default_dir("kernels"), root / "kernels")
    shutil.copytree(default_dir("layouts"), root / "layouts")
    sentinel = root / "SENTINEL"
    for name in ("evil", "seq_head_dim", "rms_norm"):
        (root / "outside" / f"{name}.py").write_text(PAYLOAD.format(sentinel=str(sentinel)))
    threads = torch.get_num_threads()
    bundle = ModelBundle.load(ModelConfig(write_tiny_gguf(root / "tiny.gguf"), threads=1,
                                          kernels_dir=root / "kernels", layouts_dir=root / "layouts"))
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=2 * N_CELLS, slot_save_path=root / "slots")).start()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root / "cwd")   # relative paths in requests land in the watched tree
        with make_client((bundle, engine), slot_save_path=root / "slots", body_limit=64 * 1024,
                         metrics=True) as client:
            yield client, root, sentinel
    engine.stop()
    torch.set_num_threads(threads)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of everything under `root` but the slot folder and __pycache__."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and Path(dirpath, d) != root / "slots"]
        for name in dirnames + filenames:
            st_ = Path(dirpath, name).lstat()
            out[str(Path(dirpath, name).relative_to(root))] = (st_.st_size, st_.st_mtime_ns)
    return out


def path_like(root: Path) -> st.SearchStrategy:
    outside = root / "outside"
    fixed = ["/tmp/x/evil", "../../etc/passwd", "a/b", "..", ".", "/", "", "~/.ssh/id_rsa", "evil\x00",
             str(outside / "evil"), str(outside / "evil.py"), str(outside / "new.bin"), "../outside/evil",
             "../outside/new.bin", "../slots/../outside/x", "seq_head_dim", "head_seq_dim", "rms_norm",
             str(root / "kernels" / "rms_norm.py"), str(root / "layouts"), "slot0.bin", "a" * 300]
    return st.sampled_from(fixed) | st.text(alphabet="./\\ab_-", max_size=12)


SCALARS = (st.none() | st.booleans() | st.sampled_from([10**30, -1, 2**63, -2**63, 0, 2**31, 1e300, -0.5, 3.7])
           | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from(["\ud800", "a\udc00b", "\ud83d", "x" * 2000, "<|im_start|>", "{{ 7*7 }}"]))


def values(root: Path) -> st.SearchStrategy:
    leaf = SCALARS | path_like(root) | st.text(max_size=8)
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=4), inner, max_size=3),
                        max_leaves=8)


def bodies(root: Path) -> st.SearchStrategy:
    v = values(root)
    base = {"prompt": st.just("hi"), "n_predict": st.integers(-1, 3),
            "messages": st.just([{"role": "user", "content": "hi"}])}
    plausible = st.fixed_dictionaries(base, optional={name: v for name in FIELDS if name not in base})
    return plausible | st.fixed_dictionaries({}, optional={name: v for name in FIELDS}) | v


def send(client, method: str, url: str, body, ctype: str | None):
    """JSON with \\u escapes (httpx's own encoding fails on a lone surrogate), any Content-Type."""
    content = json.dumps(body).encode() if method == "POST" else None
    headers = {} if ctype is None else {"content-type": ctype}
    return client.request(method, url, content=content, headers=headers)


def check(world, r) -> None:
    client, root, sentinel = world
    event(f"{r.request.url.path.split('/')[1] or '/'} {r.status_code}")
    # 501: a route this server's mode does not serve (embeddings without --embedding), said as llama-server says it
    assert r.status_code < 500 or r.status_code == 501, (r.request.method, str(r.request.url), r.status_code, r.text[:300])
    if r.status_code >= 400 and r.request.url.path.startswith("/v1/messages"):   # Anthropic's error shape
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"], r.text[:300]
    elif r.status_code >= 400:   # the status as the code; OpenAI's own string for an unknown model id
        code = r.json()["error"]["code"]
        assert code == r.status_code or (r.status_code, code) == (404, "model_not_found"), r.text[:300]
    assert not sentinel.exists(), "a module from outside the lab's folders was imported"
    assert not Path("/tmp/x/evil").exists()


def routes(client) -> list[tuple[str, str]]:
    """(method, path template) of every route of the app."""
    out = []
    for route in client.app.routes:
        if isinstance(route, Route):
            out.extend((m, route.path) for m in sorted(route.methods or ()) if m != "HEAD")
    return out


PATH_PARAMS = {"id_slot": st.sampled_from(["0", "1", "9", "-1", "abc", "..", "%2e%2e", "1e3", str(2**63)]),
               "model_id:path": st.sampled_from(["tiny.gguf", "x", "..", "a/../b", "%2e%2e", "\u00e9", "a" * 300]),
               "response_id": st.sampled_from(["resp_1", "x", "..", "%2e%2e", "a" * 300])}
# /lab/events with an integer `since` streams forever: only values it refuses
QUERIES = {"/slots/{id_slot}": {"action": st.sampled_from(["save", "restore", "erase", "x", "", "../save"])},
           "/lab/events": {"since": st.sampled_from(["x", "1.5", "", "--1", "\u00b2", "0x10"])},
           "/slots": {"fail_on_no_slot": st.sampled_from(["0", "1", "x"])}}


def url_of(draw, template: str, root: Path) -> str:
    path = template
    for name, strategy in PATH_PARAMS.items():
        path = path.replace("{" + name + "}", quote(draw(strategy | path_like(root)), safe=""))
    query = {k: draw(s) for k, s in QUERIES.get(template, {}).items()}
    return path + ("?" + "&".join(f"{k}={quote(v)}" for k, v in query.items()) if query else "")


def test_every_route_is_fuzzed(world):
    """Path parameters need a strategy here; a route added without one fails this first."""
    client = world[0]
    found = routes(client)
    assert {"/completion", "/v1/chat/completions", "/tokenize", "/lab/layout", "/slots/{id_slot}"} <= \
        {p for _, p in found}
    for _, template in found:
        params = {part[1:-1] for part in template.split("/") if part.startswith("{")}
        assert params <= PATH_PARAMS.keys(), template


@settings(max_examples=80, **SETTINGS)
@given(data=st.data())
def test_random_requests_on_every_route(world, data):
    client, root, _ = world
    before = tree(root)
    method, template = data.draw(st.sampled_from(routes(client)))
    url = url_of(data.draw, template, root)
    r = send(client, method, url, data.draw(bodies(root)), data.draw(st.sampled_from(CONTENT_TYPES)))
    check(world, r)
    assert tree(root) == before, (method, url)


SLOT_IDS = st.sampled_from(["0", "1", "9", "-1", "abc", "1e3", str(2**63)])
SLOT_NAMES = st.sampled_from(["slot0.bin", "a.bin", "x-1_2.state", "slot0.bin"])


@settings(max_examples=60, **SETTINGS)
@given(slot=SLOT_IDS, action=st.sampled_from(["save", "restore", "erase", "x", "../save"]), data=st.data())
def test_slot_actions_stay_in_the_slot_folder(world, slot, action, data):
    client, root, _ = world
    before = tree(root)
    body = {"filename": data.draw(SLOT_NAMES | path_like(root) | SCALARS)}
    url = f"/slots/{slot}?action={quote(action)}"
    check(world, send(client, "POST", url, body, data.draw(st.sampled_from(CONTENT_TYPES))))
    assert tree(root) == before, (url, body)
    assert all(p.is_file() and p.parent == root / "slots" for p in (root / "slots").rglob("*"))


@settings(max_examples=50, **SETTINGS)
@given(data=st.data())
def test_lab_verbs_import_only_their_own_modules(world, data):
    client, root, _ = world
    before = tree(root)
    path = data.draw(st.sampled_from(["/lab/layout", "/lab/reload"]))
    name = data.draw(path_like(root) | SCALARS)
    body = data.draw(st.sampled_from([{"layout": name}, {"path": name}, {"layout": name, "path": name}]))
    ctype = data.draw(st.sampled_from(CONTENT_TYPES))
    r = send(client, "POST", path, body, ctype)
    check(world, r)
    if ctype is None or not ctype.startswith("application/json"):
        assert r.status_code == 415
    assert tree(root) == before, (path, body)


def test_the_server_still_serves_after_all_that(world):
    client = world[0]
    r = client.post("/completion", json={"prompt": "hi", "n_predict": 2, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
    saved = sorted(p.name for p in (world[1] / "slots").iterdir())
    assert saved and set(saved) <= {"slot0.bin", "a.bin", "x-1_2.state"}, saved  # saves did happen, there
