"""`-hf USER/MODEL[:QUANT]` against a stand-in hub (hub_stub.py): the file llama.cpp would pick is
downloaded into the hub cache llama.cpp uses, taken from there when the hub is unreachable or
`--offline`, and a server started with `-hf` serves it under the reference as typed. Bad
references, missing quants, split files and gated repositories are one line each. The router
downloads a preset's model at its first load, and through POST /models; DELETE /models removes it.
"""

from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hub_stub import HubStub
from replica_stubs import Serving
from test_server_e2e import serving

from slotserver.errors import ConfigError
from slotserver.hub import cache
from slotserver.hub.download import fetch
from slotserver.model.gguf_file import GGUFFile
from tiny_gguf import write_tiny_gguf

TINY = (Path(__file__).parent / "fixtures" / "archs" / "llama3_freqs.gguf").read_bytes()


def split_tiny() -> dict[str, bytes]:
    """A tiny model in 3 parts, as the repository's `Q2_K/big-Q2_K-0000i-of-00003.gguf` files."""
    with tempfile.TemporaryDirectory() as folder:
        first = write_tiny_gguf(Path(folder) / "big-Q2_K.gguf", split_max_tensors=8)
        return {f"Q2_K/{p.name}": p.read_bytes() for p in sorted(first.parent.iterdir())}


PARTS = split_tiny()
SLOW = bytes(400_000)   # a file the stand-in hub trickles (never complete in the tests that ask for it)
REPO = {"m-Q4_K_M.gguf": TINY, "m-Q8_0.gguf": TINY + b"", "mmproj-m-f16.gguf": b"projector",
        "README.md": b"# m", **PARTS}


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    stub = HubStub({"org/m-GGUF": REPO, "org/only-f16": {"x-F16.gguf": TINY},
                    "org/parts-missing": {k: v for k, v in PARTS.items() if "-00002-" not in k},
                    "org/slow": {"s-Q8_0.gguf": SLOW}}, gated=("org/gated",), slow={"s-Q8_0.gguf": 0.05})
    server = Serving(stub.app)
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "LLAMA_OFFLINE", "HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MODEL_ENDPOINT", server.url)
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        yield stub, server, tmp_path / "cache"
    finally:
        server.stop()


def test_the_default_quant_is_downloaded_into_llama_cpps_cache_and_found_there_offline(hub):
    stub, server, where = hub
    path = fetch("org/m-GGUF")
    assert path.read_bytes() == TINY and path.name == "m-Q4_K_M.gguf" and where in path.parents
    assert any(s.startswith("GET /org/m-GGUF/resolve/") for s in stub.seen)
    assert cache.list_models(where) == {"org/m-GGUF:Q4_K_M": path}        # what the router's --models-cache lists
    assert fetch("org/m-GGUF", offline=True) == path                     # --offline: the cache answers
    server.stop()                                                       # the hub gone: the cache still answers
    assert fetch("org/m-GGUF") == path
    with pytest.raises(ConfigError, match="the hub did not answer .* and the model is not in the cache"):
        fetch("org/m-GGUF:Q8_0")
    with pytest.raises(ConfigError, match="'org/m-GGUF:Q8_0' is not in the models cache"):
        fetch("org/m-GGUF:Q8_0", offline=True)


def test_a_repository_that_refuses_later_is_served_from_the_cache(hub):
    """A token expired, or the repository made gated: the model already downloaded still serves
    (llama.cpp falls back to its cached files whenever the listing fails)."""
    stub, _, _ = hub
    path = fetch("org/m-GGUF")
    stub.gated = ("org/m-GGUF",)
    assert fetch("org/m-GGUF") == path
    with pytest.raises(ConfigError, match="the repository is gated"):
        fetch("org/m-GGUF:Q8_0")


def test_a_download_reports_its_progress_up_to_its_size(hub):
    seen = []
    path = fetch("org/m-GGUF:Q8_0", progress=lambda name, done, total: seen.append((name, done, total)))
    assert seen and seen[-1] == ("m-Q8_0.gguf", len(TINY), len(TINY)) and path.stat().st_size == len(TINY)
    assert all(done <= total for _, done, total in seen)


def test_a_quant_tag_or_a_file_picks_the_download(hub):
    assert fetch("org/m-GGUF:q8_0").name == "m-Q8_0.gguf"                 # tags are case-insensitive
    assert fetch("org/m-GGUF", file="m-Q8_0.gguf").name == "m-Q8_0.gguf"
    assert fetch("org/only-f16").name == "x-F16.gguf"                      # no Q4_K_M or Q8_0: the first model


def test_a_split_model_is_downloaded_part_by_part_and_loads_from_its_first(hub):
    _, _, where = hub
    seen = []
    path = fetch("org/m-GGUF:q2_k", progress=lambda name, done, total: seen.append(name))
    assert path.name == "big-Q2_K-00001-of-00003.gguf"
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == {k.split("/")[1]: v for k, v in PARTS.items()}
    assert sorted(set(seen)) == sorted(PARTS)                             # every part's progress, by its path
    assert len(GGUFFile.open(path).tensors) == 20                         # all three parts' tensors
    assert cache.list_models(where)["org/m-GGUF:Q2_K"] == path           # listed once, as its first part
    assert fetch("org/m-GGUF:Q2_K", offline=True) == path


@pytest.mark.parametrize("ref, file, words", [
    ("org/m-GGUF:Q5_K_S", None, "no model file tagged Q5_K_S in the repository (its GGUF files: m-Q4_K_M.gguf"),
    ("org/m-GGUF", "m-Q2.gguf", "-hff m-Q2.gguf: not in org/m-GGUF"),
    ("org/parts-missing:Q2_K", None, "big-Q2_K-00001-of-00003.gguf is one of 3 parts of a split GGUF, and part 2 "
                                     "is not in the repository"),
    ("org/gated", None, "the repository is gated"),
    ("org/none", None, "no such repository on the hub"),
    ("just-a-name", None, "expected USER/MODEL[:QUANT]"),
])
def test_what_cannot_be_fetched_is_one_line_saying_why(hub, ref, file, words):
    with pytest.raises(ConfigError, match=None) as e:
        fetch(ref, file)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_server_started_with_hf_serves_the_model_under_its_reference(hub, tmp_path):
    with serving(tmp_path, "-hf", "org/m-GGUF:Q8_0", "-c", "256", "-np", "1", "--no-warmup", "--no-watch") as srv:
        models = httpx.get(srv.url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["org/m-GGUF:Q8_0"]
        out = httpx.post(srv.url + "/completion", json={"prompt": "hi", "n_predict": 3, "temperature": 0}).json()
        assert out["timings"]["predicted_n"] == 3
    assert "-hf org/m-GGUF:Q8_0: m-Q8_0.gguf" in (tmp_path / "server.log").read_text()


def test_a_router_presets_hf_repo_is_downloaded_when_the_model_loads(hub, tmp_path):
    """llama-server's router: a preset's `hf-repo` not in the cache is the child's `-hf`, so the first
    request for it downloads it (into the router's --models-cache), then it answers."""
    ini = tmp_path / "presets.ini"
    ini.write_text("version = 1\n[m]\nhf-repo = org/m-GGUF:Q8_0\nctx-size = 256\n")
    cache_dir = tmp_path / "hub"
    cache_dir.mkdir()
    with serving(tmp_path, "--models-preset", str(ini), "--models-cache", str(cache_dir), "-np", "1",
                 "--no-warmup", "--no-watch") as srv:
        listed = {m["id"]: m["status"]["value"] for m in httpx.get(srv.url + "/v1/models").json()["data"]}
        assert listed == {"m": "unloaded"}
        out = httpx.post(srv.url + "/completion", json={"model": "m", "prompt": "hi", "n_predict": 2, "temperature": 0},
                         timeout=60).json()
        assert out["timings"]["predicted_n"] == 2
    assert cache.list_models(cache_dir) == {"org/m-GGUF:Q8_0": cache.resolve(cache_dir, "org/m-GGUF:Q8_0")}


def test_the_routers_download_api_downloads_lists_and_removes(hub, tmp_path):
    """llama-server's POST /models (checked on the hub first, then downloaded in the background,
    listed as downloading meanwhile) and DELETE /models (a cache model's files)."""
    cache_dir = tmp_path / "hub"
    cache_dir.mkdir()
    with serving(tmp_path, "--models-cache", str(cache_dir), "-c", "256", "-np", "1", "--no-warmup",
                 "--no-watch") as srv:
        def listed() -> dict:
            return {m["id"]: m["status"]["value"] for m in httpx.get(srv.url + "/models").json()["data"]}

        def post(ref: str) -> httpx.Response:
            return httpx.post(srv.url + "/models", json={"model": ref}, timeout=30)

        assert listed() == {}
        events = []
        with httpx.stream("GET", srv.url + "/models/sse", timeout=30) as stream:
            assert post("org/m-GGUF:Q8_0").json() == {"success": True}
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1]["event"] in ("download_finished", "download_failed"):
                        break
        kinds = [e["event"] for e in events if e["model"] == "org/m-GGUF:Q8_0"]
        assert kinds[0] == "model_status" and kinds[-1] == "download_finished" and "download_progress" in kinds
        last = [e for e in events if e["event"] == "download_progress"][-1]["data"]["progress"]["m-Q8_0.gguf"]
        assert last == {"done": len(TINY), "total": len(TINY)}
        deadline = time.time() + 30
        while listed().get("org/m-GGUF:Q8_0") != "unloaded":
            assert time.time() < deadline and set(listed()) <= {"org/m-GGUF:Q8_0"}, listed()
            time.sleep(0.1)
        assert cache.list_models(cache_dir) == {"org/m-GGUF:Q8_0": cache.resolve(cache_dir, "org/m-GGUF:Q8_0")}
        out = httpx.post(srv.url + "/completion", json={"model": "org/m-GGUF:Q8_0", "prompt": "hi", "n_predict": 2},
                         timeout=60).json()
        assert out["timings"]["predicted_n"] == 2
        for ref, words in (("org/m-GGUF:Q8_0", "already exists"), ("org/m-GGUF:Q5_K_S", "no model file tagged"),
                           ("org/gated", "gated"), ("nonsense", "expected USER/MODEL")):
            r = post(ref)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        r = httpx.delete(srv.url + "/models", params={"model": "org/m-GGUF:Q8_0"}, timeout=30)
        assert r.json() == {"success": True} and listed() == {} and cache.list_models(cache_dir) == {}
        assert httpx.delete(srv.url + "/models", params={"model": "org/other"}).status_code == 400


def test_the_download_api_needs_the_key_and_takes_one_download_per_name(hub, tmp_path):
    """/models is public to read only: POST and DELETE need the router's key. Two POSTs of one name
    at once: one downloads, the other is refused."""
    cache_dir = tmp_path / "hub"
    cache_dir.mkdir()
    key = {"Authorization": "Bearer k"}
    with serving(tmp_path, "--models-cache", str(cache_dir), "--api-key", "k", "--no-watch") as srv:
        assert httpx.get(srv.url + "/models").status_code == 200
        assert httpx.post(srv.url + "/models", json={"model": "org/m-GGUF:Q8_0"}).status_code == 401
        assert httpx.delete(srv.url + "/models", params={"model": "org/m-GGUF:Q8_0"}).status_code == 401
        with ThreadPoolExecutor(2) as pool:
            codes = sorted(pool.map(lambda _: httpx.post(srv.url + "/models", json={"model": "org/m-GGUF:Q8_0"},
                                                         headers=key, timeout=30).status_code, range(2)))
        assert codes == [200, 400]
        deadline = time.time() + 30
        while "org/m-GGUF:Q8_0" not in cache.list_models(cache_dir):
            assert time.time() < deadline
            time.sleep(0.1)


def test_deleting_or_unloading_a_download_in_flight_stops_it(hub, tmp_path):
    """llama-server's router cancels a download on DELETE /models (its files go, a partial one too)
    and on POST /models/unload (the partial file stays, resumable); either ends it at once, not when
    its bytes are all in."""
    stub, _, _ = hub
    cache_dir = tmp_path / "hub"
    cache_dir.mkdir()
    blobs = cache_dir / "models--org--slow" / "blobs"
    assert len(SLOW) // 4096 * 0.05 > 4                       # the whole file would take seconds
    with serving(tmp_path, "--models-cache", str(cache_dir), "--no-watch") as srv:
        def listed() -> dict:
            return {m["id"]: m["status"]["value"] for m in httpx.get(srv.url + "/models").json()["data"]}

        for stop in ("delete", "unload"):
            stub.seen.clear()
            assert httpx.post(srv.url + "/models", json={"model": "org/slow:Q8_0"}, timeout=30).status_code == 200
            deadline = time.time() + 30
            while not any(s.startswith("GET /org/slow/resolve/") for s in stub.seen):   # its bytes flow
                assert time.time() < deadline
                time.sleep(0.05)
            time.sleep(0.3)
            assert listed() == {"org/slow:Q8_0": "downloading"} and list(blobs.glob("*.incomplete"))
            t0 = time.time()
            r = (httpx.delete(srv.url + "/models", params={"model": "org/slow:Q8_0"}, timeout=30) if stop == "delete"
                 else httpx.post(srv.url + "/models/unload", json={"model": "org/slow:Q8_0"}, timeout=30))
            assert r.json() == {"success": True}
            while listed():
                assert time.time() - t0 < 3, f"{stop}: the download was not stopped"
                time.sleep(0.05)
            assert cache.list_models(cache_dir) == {}
            assert bool(list(blobs.glob("*.incomplete"))) == (stop == "unload")   # unload: resumable


def test_an_offline_router_downloads_nothing(hub, tmp_path):
    """--offline: the children take hub models from the cache (their -hf gets --offline), and POST
    /models is refused rather than reaching the hub."""
    stub, _, _ = hub
    cache_dir = tmp_path / "hub"
    cache_dir.mkdir()
    with serving(tmp_path, "--models-cache", str(cache_dir), "--offline", "--no-watch") as srv:
        r = httpx.post(srv.url + "/models", json={"model": "org/m-GGUF:Q8_0"}, timeout=30)
        assert r.status_code == 400 and "runs offline" in r.json()["error"]["message"]
    assert not any("/org/m-GGUF/" in s for s in stub.seen) and cache.list_models(cache_dir) == {}


def test_a_download_deleted_while_its_reference_is_checked_never_starts(hub, tmp_path):
    """DELETE /models while POST /models still waits for the hub's listing: the download is cancelled
    before its process starts (no byte is asked of the hub), and the name is free again after."""
    stub, _, _ = hub
    stub.slow_tree = 2.0
    cache_dir = tmp_path / "hub"
    cache_dir.mkdir()
    with serving(tmp_path, "--models-cache", str(cache_dir), "--no-watch") as srv:
        with ThreadPoolExecutor(1) as pool:
            posted = pool.submit(httpx.post, srv.url + "/models", json={"model": "org/m-GGUF:Q8_0"}, timeout=30)
            while not any("/tree/" in s for s in stub.seen):   # the check is under way: the name is reserved
                time.sleep(0.02)
            deleted = httpx.delete(srv.url + "/models", params={"model": "org/m-GGUF:Q8_0"}, timeout=30)
            assert posted.result().json() == {"success": True} and deleted.json() == {"success": True}
        deadline = time.time() + 10
        while httpx.get(srv.url + "/models").json()["data"]:
            assert time.time() < deadline
            time.sleep(0.05)
        assert not any("/resolve/" in s for s in stub.seen)   # no byte, not even a HEAD
        assert cache.list_models(cache_dir) == {}
        stub.slow_tree = 0.0   # the name is free: a new POST downloads it
        assert httpx.post(srv.url + "/models", json={"model": "org/m-GGUF:Q8_0"}, timeout=30).status_code == 200
        while "org/m-GGUF:Q8_0" not in cache.list_models(cache_dir):
            assert time.time() < deadline + 20
            time.sleep(0.1)
