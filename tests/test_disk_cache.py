"""--cache-disk: prompt-cache entries survive a restart (a new engine finds the old one's KV on
disk and answers as if it had computed it), and nothing wrong is ever loaded: another model's or
KV type's entry, a truncated or corrupted file, a temporary left by a killed write; the folder
keeps to its size cap, least recently used out first."""

from __future__ import annotations


import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.disk_cache import SUFFIX, DiskCache, model_key
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.sampling.params import SamplingParams
from tiny_gguf import write_tiny_gguf

HISTORY = tuple(range(5, 85))


def _run(engine: Engine, prompt, n: int = 4):
    req = Request(prompt, SamplingParams(temperature=0.0), n_predict=n, ignore_eos=True)
    return engine.submit(req).result(60)


def _engine(bundle, folder, ram: int = 0) -> Engine:
    return Engine(bundle, EngineConfig(n_parallel=2, ctx_size=512, cache_ram_mib=ram, cache_disk=folder)).start()


def test_a_restart_finds_the_history_on_disk(tmp_path):
    bundle = ModelBundle.load(ModelConfig(write_tiny_gguf(tmp_path / "m.gguf", ctx_len=512), threads=1))
    engine = _engine(bundle, tmp_path / "kv")
    first = _run(engine, HISTORY)
    engine.stop()                                   # the slot's KV goes to disk at shutdown
    assert list((tmp_path / "kv").glob(f"*/*{SUFFIX}"))
    turn = HISTORY + tuple(first.tokens) + (7, 8, 9)
    restarted = _engine(bundle, tmp_path / "kv", ram=16)
    try:
        again = _run(restarted, turn)
        assert again.final.n_cached == len(HISTORY) + len(first.tokens) - 1   # all but the last sampled token
        assert restarted.disk_cache.hits == 1
    finally:
        restarted.stop()
    cold = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=512)).start()
    try:
        assert _run(cold, turn).tokens == again.tokens   # the same answer as computing it all
    finally:
        cold.stop()


def _store(tmp_path, key="k1", dtype=torch.float32, limit=-1) -> DiskCache:
    return DiskCache(tmp_path, limit, key, dtype)


def _entry(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, n, 2, 8, generator=g), torch.randn(2, n, 2, 8, generator=g)


def test_wrong_truncated_or_corrupt_entries_are_skipped_never_loaded(tmp_path):
    store = _store(tmp_path)
    for i, tokens in enumerate([(1, 2, 3), (4, 5, 6), (7, 8, 9)]):
        store.save(tokens, *_entry(3, i))
    store.flush()
    paths = {t: store.index[t] for t in store.index}
    assert torch.equal(store.load((1, 2, 3))[0], _entry(3, 0)[0]) and store.best((1, 2, 99)) == ((1, 2, 3), 2)
    raw = paths[(4, 5, 6)].read_bytes()
    paths[(4, 5, 6)].write_bytes(raw[:-10])                                 # truncated
    body = bytearray(paths[(7, 8, 9)].read_bytes())
    body[-5] ^= 0xFF
    paths[(7, 8, 9)].write_bytes(bytes(body))                               # a flipped byte: the CRC says so
    assert store.load((4, 5, 6)) is None and store.load((7, 8, 9)) is None
    assert set(store.index) == {(1, 2, 3)} and not paths[(4, 5, 6)].exists()
    assert store.best((4, 5, 6)) is None and store.best((1, 2)) == ((1, 2, 3), 2)   # dropped: never offered
    (store.folder / f".tmp-x-1{SUFFIX}").write_bytes(b"half a write")      # a killed write's temporary
    assert set(_store(tmp_path).index) == {(1, 2, 3)}
    assert _store(tmp_path, key="other").index == {}                       # another model's folder
    paths[(1, 2, 3)].rename(tmp_path / "other" / paths[(1, 2, 3)].name)     # moved into the wrong folder
    assert _store(tmp_path, key="other").index == {}                       # its header names k1: skipped


def test_the_folder_keeps_to_its_cap_least_recently_used_first(tmp_path):
    one = len(_entry(4)[0].numpy().tobytes()) * 2 + 400                     # an entry's bytes, header included
    store = _store(tmp_path, limit=3 * one)
    for i in range(3):
        store.save((i, 1, 2, 3), *_entry(4, i))
        store.flush()
    store.load((0, 1, 2, 3))                                                # used: now the most recent
    store.save((9, 1, 2, 3), *_entry(4, 9))
    store.flush()
    assert set(store.index) == {(0, 1, 2, 3), (2, 1, 2, 3), (9, 1, 2, 3)}
    assert store.best((1, 1, 2, 3)) is None and store.best((2, 1, 2, 9)) == ((2, 1, 2, 3), 3)   # evicted: never offered
    assert _store(tmp_path, limit=3 * one).best((9, 1, 7)) == ((9, 1, 2, 3), 2)     # a restart indexes the files


def test_the_key_follows_the_model_file_and_the_kv_type(tmp_path):
    a = write_tiny_gguf(tmp_path / "a.gguf")
    b = write_tiny_gguf(tmp_path / "b.gguf", seed=1)
    geo = (2, 2, 16)
    assert model_key(a, torch.float16, geo) == model_key(a, torch.float16, geo)
    assert len({model_key(a, torch.float16, geo), model_key(b, torch.float16, geo),
                model_key(a, torch.float32, geo)}) == 3


def test_a_split_models_key_follows_every_part(tmp_path):
    """The first part may be metadata alone (--no-tensor-first-split): two requants share it."""
    (tmp_path / "a").mkdir()
    first = write_tiny_gguf(tmp_path / "a" / "m.gguf", split_max_tensors=10, small_first_shard=True)
    geo = (2, 2, 16)
    before = model_key(first, torch.float16, geo)
    last = first.with_name("m-00003-of-00003.gguf")
    last.write_bytes(last.read_bytes()[:-4] + b"\x01\x02\x03\x04")   # another file's last weights
    assert model_key(first, torch.float16, geo) != before


def test_a_server_stopped_by_sigterm_writes_its_slots_to_disk(tmp_path):
    """`serve --cache-disk DIR` stopped the way process managers stop it (SIGTERM): the slots' KV
    is on disk after exit (uvicorn re-raises the signal after its shutdown; launch.serve turns it
    into a normal exit so the engine's stop runs), and the exit status is 0."""
    import json
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    model = write_tiny_gguf(tmp_path / "m.gguf", ctx_len=512)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "slotserver.cli.main", "serve", "-m", str(model), "--port",
                               str(port), "-np", "2", "-c", "512", "-t", "1", "--no-watch", "--cache-disk",
                               str(tmp_path / "kv")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"prompt": list(HISTORY), "n_predict": 3}).encode()
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/completion", body), timeout=60)
        assert not list((tmp_path / "kv").glob(f"*/*{SUFFIX}"))   # nothing left a slot yet
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        server.kill()
    entries = list((tmp_path / "kv").glob(f"*/*{SUFFIX}"))
    assert len(entries) == 1 and json.loads(entries[0].read_bytes().split(b"\n", 1)[0])["tokens"][:80] == list(HISTORY)
