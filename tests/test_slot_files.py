"""Slot save / restore / erase through the layout's canonical export/import, with file names
that cannot escape --slot-save-path, restores that refuse files not fitting the running model
(out-of-vocabulary ids, another dtype, NaN), saves that never leave a half-written file, and
saves that write the slot's own cells only (never another slot's K/V), on every layout."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
import torch
from starlette.testclient import TestClient
from tiny_gguf import write_tiny_gguf

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.engine.engine import Engine
from slotserver.engine.config import EngineConfig
from slotserver.engine.request import Request, RequestError
from slotserver.model.sampling.sampler import SamplingParams
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.engine.slot_files import SlotBusy
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.layouts import available_layouts, create_layout, load_layout
from slotserver.server.launch import LaunchPlan, load

GREEDY = SamplingParams(temperature=0)
PROMPT = tuple(range(30, 70))
LAYOUTS = available_layouts()
OVERHEAD = 4096                               # a slot file's bytes besides K/V: zip records, pickle, token ids
MARKER = 1234.5                               # another stream's value, to be found nowhere in a file
MARKS = struct.pack("<f", MARKER) * 2         # two float32 markers in a row


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf", ctx_len=512)
    return ModelBundle.load(ModelConfig(model_path=path))


def _engine(bundle, folder, ctx=256, n=2) -> Engine:
    return Engine(bundle, EngineConfig(n_parallel=n, ctx_size=ctx, slot_save_path=folder))


def _run(engine, req):
    h = engine.submit(req)
    while engine.step():
        pass
    return h.result(timeout=0)


def _act(engine, *args):
    fut = engine.slot_action(*args)
    engine.step()
    return fut.result(timeout=0)


def test_save_erase_restore_round_trip(bundle, tmp_path):
    engine = _engine(bundle, tmp_path)
    first = _run(engine, Request(PROMPT, GREEDY, n_predict=6, id_slot=0))
    saved = _act(engine, 0, "save", "story.bin")
    assert saved["n_saved"] == len(PROMPT) + 5 and (tmp_path / "story.bin").is_file()
    assert _act(engine, 0, "erase")["n_erased"] == saved["n_saved"]
    assert _run(engine, Request(PROMPT, GREEDY, n_predict=6, id_slot=0)).final.n_cached == 0
    other = _engine(bundle, tmp_path)  # a fresh server restores into its slot 1
    assert _act(other, 1, "restore", "story.bin")["n_restored"] == saved["n_saved"]
    again = _run(other, Request(PROMPT, GREEDY, n_predict=6, id_slot=1))
    assert again.final.n_cached == len(PROMPT) - 1 and again.tokens == first.tokens


@pytest.mark.parametrize("name", ["../evil", "a/b", ".hidden", "", "x" * 300, "..", "a\\b", "nul\0", "x.bin\n"])
def test_bad_file_names_are_refused(bundle, tmp_path, name):
    engine = _engine(bundle, tmp_path)
    with pytest.raises(RequestError):
        _act(engine, 0, "save", name)
    assert list(tmp_path.iterdir()) == []


def test_symlink_escape_is_refused(bundle, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "slots"
    folder.mkdir()
    os.symlink(outside / "target.bin", folder / "link.bin")
    engine = _engine(bundle, folder)
    with pytest.raises(RequestError, match="escapes"):
        _act(engine, 0, "save", "link.bin")
    assert not (outside / "target.bin").exists()


def test_restore_into_smaller_slot_and_bad_files_are_refused(bundle, tmp_path):
    big = _engine(bundle, tmp_path, ctx=512, n=1)
    _run(big, Request(PROMPT * 4, GREEDY, n_predict=4))
    _act(big, 0, "save", "long.bin")
    small = _engine(bundle, tmp_path, ctx=256, n=2)
    with pytest.raises(RequestError, match="only 128 cells"):
        _act(small, 0, "restore", "long.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a slot file")
    with pytest.raises(RequestError, match="not a valid slot file"):
        _act(small, 0, "restore", "junk.bin")
    with pytest.raises(FileNotFoundError):
        _act(small, 0, "restore", "missing.bin")


def test_busy_slot_cannot_be_saved(bundle, tmp_path):
    engine = _engine(bundle, tmp_path)
    engine.submit(Request(PROMPT, GREEDY, n_predict=50, id_slot=0))
    engine.step()
    with pytest.raises(SlotBusy):
        _act(engine, 0, "save", "x.bin")


def _tamper(folder, src: str, dst: str, edit) -> None:
    """Copy slot file `src` to `dst` with `edit(data)` applied, as a hand-made file would be."""
    data = torch.load(folder / src, weights_only=True)
    edit(data)
    torch.save(data, folder / dst)


def _set_token(pos: int, value: int):
    return lambda d: d["tokens"].__setitem__(pos, value)


def _poison(d: dict) -> None:
    d["k"][1, 2, 0, 3] = float("nan")


@pytest.fixture
def saved(bundle, tmp_path):
    """(engine, folder) with slot 0 saved as good.bin after a short generation."""
    engine = _engine(bundle, tmp_path)
    _run(engine, Request(PROMPT, GREEDY, n_predict=4, id_slot=0))
    _act(engine, 0, "save", "good.bin")
    return engine, tmp_path


@pytest.mark.parametrize("edit, reason", [
    (_set_token(3, 10**9), r"token id 1000000000 at position 3 is outside the vocabulary \(\d+ tokens\)"),
    (_set_token(0, -5), r"token id -5 at position 0 is outside the vocabulary"),
    (_set_token(1, 7.5), r"token id 7.5 at position 1 is outside the vocabulary"),
    (lambda d: d.update(k=d["k"].half()), r"K/V dtype torch.float16 does not match the running cache \(torch.float32\)"),
    (_poison, "K/V holds NaN or infinite values"),
    (lambda d: d["v"].__setitem__((0, 0, 0, 0), float("-inf")), "K/V holds NaN or infinite values"),
])
def test_restore_refuses_files_that_do_not_fit_the_running_model(saved, edit, reason):
    engine, folder = saved
    _act(engine, 0, "erase")
    _tamper(folder, "good.bin", "bad.bin", edit)
    with pytest.raises(RequestError, match=f"slot file 'bad.bin'.*{reason}"):
        _act(engine, 0, "restore", "bad.bin")
    assert engine.sched.slots.slots[0].cached == []  # nothing of the bad file was taken
    assert _act(engine, 0, "restore", "good.bin")["n_restored"] == len(PROMPT) + 3


def test_a_failing_save_keeps_the_previous_file(saved, monkeypatch):
    engine, folder = saved
    before = (folder / "good.bin").read_bytes()

    def broken_save(obj, f):  # a disk that fills up half way through the file
        f.write(before[: len(before) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="No space"):
        _act(engine, 0, "save", "good.bin")
    monkeypatch.undo()
    assert (folder / "good.bin").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["good.bin"]  # no temporary file left
    assert _act(engine, 1, "restore", "good.bin")["n_restored"] == len(PROMPT) + 3


@pytest.fixture
def http(bundle, tmp_path):
    """(client, folder): the HTTP API around a running engine that saves into `folder`."""
    engine = _engine(bundle, tmp_path).start()
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), slot_save_path=tmp_path))
    state.set_loaded(bundle, engine)
    with TestClient(create_app(state)) as client:
        yield client, tmp_path
    engine.stop()


def test_http_refuses_a_name_with_a_trailing_newline(http):
    client, folder = http
    r = client.post("/slots/0?action=save", json={"filename": "x.bin\n"})
    assert r.status_code == 400 and "Invalid filename" in r.json()["error"]["message"]
    assert list(folder.iterdir()) == []


def test_http_restore_of_a_bad_file_is_400_with_the_reason(http):
    client, folder = http
    assert client.post("/completion", json={"prompt": [5, 6, 7, 8], "n_predict": 2, "id_slot": 0,
                                                "temperature": 0, "ignore_eos": True}).status_code == 200
    assert client.post("/slots/0?action=save", json={"filename": "good.bin"}).json()["n_saved"] == 5
    _tamper(folder, "good.bin", "bad.bin", _set_token(2, 10**9))
    r = client.post("/slots/1?action=restore", json={"filename": "bad.bin"})
    assert r.status_code == 400
    assert "token id 1000000000 at position 2 is outside the vocabulary" in r.json()["error"]["message"]
    assert client.post("/slots/1?action=restore", json={"filename": "good.bin"}).json()["n_restored"] == 5


@pytest.mark.parametrize("n", [0, 5])
@pytest.mark.parametrize("name", LAYOUTS)
def test_every_layout_exports_only_the_streams_own_cells(tmp_path, name, n):
    """Issue 32: torch.save writes a tensor's whole storage, and head_seq_dim's export of an empty
    stream was a view of the cache, so the file held every stream. Saved the way a slot file is, each
    layout's export must cost the `n` cells and hold nothing of the stream next door."""
    spec = KVSpec(n_layers=3, n_streams=3, n_cells=40, n_kv_heads=2, head_dim=8)
    lay = create_layout(load_layout(name), spec)
    rows = torch.randn(n, spec.n_kv_heads, spec.head_dim, generator=torch.Generator().manual_seed(1))
    secret = torch.full((spec.n_cells, spec.n_kv_heads, spec.head_dim), MARKER)
    for layer in range(spec.n_layers):
        lay.write(layer, torch.full((spec.n_cells,), 1), torch.arange(spec.n_cells), secret, secret)
        lay.write(layer, torch.zeros(n, dtype=torch.long), torch.arange(n), rows, -rows)
    k, v = lay.export_stream(0, n)
    torch.save({"k": k, "v": v}, tmp_path / "s.bin")
    data = (tmp_path / "s.bin").read_bytes()
    assert len(data) <= n * spec.bytes_per_cell + OVERHEAD, f"{len(data)} bytes for {n} cells"
    assert MARKS not in data, "the file holds another stream's K/V"


def _cell_bytes(engine) -> int:
    """K plus V bytes of one cell of one slot, all layers: what a slot file pays per token."""
    g = engine.port.geometry()
    return 2 * g.n_layers * g.n_kv_heads * g.head_dim * torch.empty((), dtype=g.dtype).element_size()


def _rows_of_slot(engine, slot_id: int) -> list[bytes]:
    """Each cached cell's layer-0 K (all heads) as file bytes: a slot file leaking it holds one."""
    _, k, _ = engine.port.export_slot(slot_id)
    return [k[0, p].contiguous().numpy().tobytes() for p in range(k.shape[1])]


@pytest.mark.parametrize("n_prompt", [0, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_slot_file_holds_only_its_slots_cells(bundle, tmp_path, layout, n_prompt):
    """Issue 32's reproduction: slot 1 serves a "secret" prompt, then slot 0 (empty, or holding a
    short prompt) is saved. It wrote 70 MB holding slot 1's K/V; n_written must pay only slot 0's cells."""
    layout_bundle = ModelBundle.load(ModelConfig(model_path=bundle.config.model_path, layout=layout))
    engine = _engine(layout_bundle, tmp_path)
    if n_prompt:
        _run(engine, Request(tuple(range(5, 5 + n_prompt)), GREEDY, n_predict=1, id_slot=0))
    _run(engine, Request(PROMPT, GREEDY, n_predict=4, id_slot=1))
    saved = _act(engine, 0, "save", "e.bin")
    data = (tmp_path / "e.bin").read_bytes()
    assert saved["n_saved"] == n_prompt and saved["n_written"] == len(data)
    assert len(data) <= n_prompt * _cell_bytes(engine) + OVERHEAD, f"{len(data)} bytes for {n_prompt} cells"
    secrets = _rows_of_slot(engine, 1)
    assert len(secrets) == len(PROMPT) + 3 and not any(row in data for row in secrets)


@pytest.mark.parametrize("n_prompt", [0, 3])
def test_a_layout_export_that_returns_a_view_still_saves_only_the_slot(bundle, tmp_path, monkeypatch, n_prompt):
    """A lab layout may hand out a slice of a larger tensor; the save must copy it, not write
    the slice's whole storage (here a marker block standing for the other slots)."""
    engine = _engine(bundle, tmp_path)
    if n_prompt:
        _run(engine, Request(tuple(range(5, 5 + n_prompt)), GREEDY, n_predict=1, id_slot=0))
    layout, real = engine.cache.layout, engine.cache.layout.export_stream

    def in_a_larger_tensor(t: torch.Tensor) -> torch.Tensor:
        others = torch.full((t.shape[0], 100, *t.shape[2:]), MARKER, dtype=t.dtype)
        return torch.cat([t, others], dim=1)[:, :t.shape[1]]

    def leaky(stream: int, n: int):
        return tuple(in_a_larger_tensor(t) for t in real(stream, n))

    monkeypatch.setattr(layout, "export_stream", leaky)
    want = engine.port.export_slot(0)
    saved = _act(engine, 0, "save", "v.bin")
    data = (tmp_path / "v.bin").read_bytes()
    assert saved["n_written"] == len(data) <= n_prompt * _cell_bytes(engine) + OVERHEAD
    assert MARKS not in data
    monkeypatch.undo()
    _act(engine, 1, "restore", "v.bin")
    got = engine.port.export_slot(1)
    assert got[0] == want[0] and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


def test_http_save_or_restore_onto_a_folder_is_400(http):
    """A file name that is a folder: a save failed late with a 500 (IsADirectoryError and a
    traceback), a restore said "not found". Both are the user's mistake: 400, naming it."""
    client, folder = http
    (folder / "d.bin").mkdir()
    for action in ("save", "restore"):
        r = client.post(f"/slots/0?action={action}", json={"filename": "d.bin"})
        assert r.status_code == 400, (action, r.status_code, r.text)
        assert "slot file name 'd.bin' is a folder" in r.json()["error"]["message"]
    assert [p.name for p in folder.iterdir()] == ["d.bin"] and (folder / "d.bin").is_dir()


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _plant_temporaries(folder) -> tuple[list[str], list[str]]:
    """(stale, kept) file names: temporaries of killed saves, and files cleanup must not touch."""
    stale = [f".a.bin.tmp-{_dead_pid()}-0123abcd",           # its writer was killed
             f".b.bin.tmp-{os.getpid()}-89abcdef"]           # our pid, no save of ours writes it
    kept = [f".c.bin.tmp-{os.getppid()}-0123abcd",           # a live process's (another server's)
            "d.bin.tmp-1-0123abcd", ".notes", "e.bin"]       # user files, not the temporary pattern
    for name in stale + kept:
        (folder / name).write_bytes(b"x" * 1000)
    return stale, kept


def test_the_next_save_removes_temporaries_that_killed_saves_left(bundle, tmp_path):
    engine = _engine(bundle, tmp_path)
    _, kept = _plant_temporaries(tmp_path)
    _act(engine, 0, "save", "s.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept + ["s.bin"])


def test_server_start_removes_temporaries_that_killed_saves_left(bundle, tmp_path):
    _, kept = _plant_temporaries(tmp_path)
    plan = LaunchPlan(bundle.config, EngineConfig(n_parallel=2, ctx_size=256, slot_save_path=tmp_path),
                      watch=False, warmup=False)
    load(ServerState(), plan, "http://test")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
