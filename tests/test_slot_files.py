"""Slot save / restore / erase through the layout's canonical export/import, with file names
that cannot escape --slot-save-path, restores that refuse files not fitting the running model
(out-of-vocabulary ids, another dtype, NaN), and saves that never leave a half-written file."""

from __future__ import annotations

import os

import pytest
import torch
from starlette.testclient import TestClient
from tiny_gguf import write_tiny_gguf

from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.engine.engine import Engine
from slotserver.engine.config import EngineConfig
from slotserver.engine.request import Request, RequestError
from slotserver.model.sampling import SamplingParams
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.engine.slot_files import SlotBusy

GREEDY = SamplingParams(temperature=0)
PROMPT = tuple(range(30, 70))


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
