"""Slot save / restore / erase through the layout's canonical export/import, with file names
that cannot escape --slot-save-path."""

from __future__ import annotations

import os

import pytest
from tiny_gguf import write_tiny_gguf

from slotserver.bundle import ModelBundle
from slotserver.config import ModelConfig
from slotserver.engine import Engine
from slotserver.engine_config import EngineConfig
from slotserver.request import Request, RequestError
from slotserver.sampling import SamplingParams
from slotserver.slot_files import SlotBusy

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


@pytest.mark.parametrize("name", ["../evil", "a/b", ".hidden", "", "x" * 300, "..", "a\\b", "nul\0"])
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
