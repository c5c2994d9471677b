"""A GGUF split into parts (`NAME-00001-of-0000N.gguf`...) serves from its first part as the whole
file does, and a broken set of parts is refused in one line naming the file (model/gguf_split.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from starlette.testclient import TestClient

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.gguf_file import GGUFError, GGUFFile, open_checked
from slotserver.server import ServerConfig, ServerState, create_app
from gguf_rewrite import rewrite
from tiny_gguf import write_tiny_gguf

QT = gguf.GGMLQuantizationType
# Q8_0 blocks are served in place from the mapping; 3 tensors a part cuts through a layer's q/k/v,
# which the whole file serves as one view of adjacent bytes (block_layer.py qlinear)
MODEL = dict(tensor_type=QT.Q8_0, n_layers=3, seed=5)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("split")
    (folder / "whole").mkdir()
    (folder / "parts").mkdir()
    return (write_tiny_gguf(folder / "whole" / "tiny.gguf", **MODEL),
            write_tiny_gguf(folder / "parts" / "tiny.gguf", split_max_tensors=3, **MODEL))


def completion(path: Path) -> dict:
    bundle = ModelBundle.load(ModelConfig(path, threads=1))
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=128)).start()
    try:
        state = ServerState(ServerConfig(model_path=str(path)))
        state.set_loaded(bundle, engine)
        with TestClient(create_app(state)) as c:
            r = c.post("/completion", json={"prompt": "Hello world, the", "n_predict": 12, "temperature": 0,
                                            "seed": 1, "n_probs": 2, "return_tokens": True})
            assert r.status_code == 200, r.text
            props = c.get("/props").json()
            return {**r.json(), "model_path": props["model_path"]}
    finally:
        engine.stop()


def test_the_first_part_serves_what_the_whole_file_serves(files):
    whole, first = files
    assert first.name == "tiny-00001-of-00010.gguf"
    assert GGUFFile.open(first).metadata["split.count"] == 10
    a, b = completion(whole), completion(first)
    assert len(a["tokens"]) == 12
    assert (b["content"], b["tokens"]) == (a["content"], a["tokens"])
    assert b["completion_probabilities"] == a["completion_probabilities"]   # the same logits, not just argmaxes
    assert b["model_path"] == str(first)


def test_a_first_part_of_metadata_alone_serves_as_well(files, tmp_path):
    """The converters' --no-tensor-first-split: part 1 holds no tensor, every weight is elsewhere."""
    first = write_tiny_gguf(tmp_path / "tiny.gguf", split_max_tensors=10, small_first_shard=True, **MODEL)
    f = GGUFFile.open(first)
    assert {i.part for i in f.tensors.values()} == {1, 2, 3} and len(f.tensors) == 29
    a, b = completion(files[0]), completion(first)
    assert (b["content"], b["completion_probabilities"]) == (a["content"], a["completion_probabilities"])


def test_a_later_part_names_the_first(files):
    second = files[1].with_name("tiny-00002-of-00010.gguf")
    with pytest.raises(GGUFError, match=r"tiny-00002-of-00010.gguf: is part 2 of 10 of a split GGUF: "
                                        r"give the first part, tiny-00001-of-00010.gguf"):
        GGUFFile.open(second)


def test_a_missing_part_is_named(files, tmp_path):
    """(serve prints a load's GGUFError as its one line: test_server_cli's broken-model test)"""
    for part in files[1].parent.iterdir():
        if "-00004-" not in part.name:
            shutil.copy(part, tmp_path / part.name)
    with pytest.raises(GGUFError, match=r"tiny-00004-of-00010.gguf: part 4 of 10 of tiny-00001-of-00010.gguf: "
                                        r"file not found"):
        GGUFFile.open(tmp_path / files[1].name)


def test_a_renamed_first_part_says_why_its_parts_are_not_found(files, tmp_path):
    renamed = tmp_path / "model.gguf"
    shutil.copy(files[1], renamed)
    with pytest.raises(GGUFError, match=r"model.gguf: is part 1 of 10 of a split GGUF \(split.no 0\), but its "
                                        r"name does not end in -00001-of-00010.gguf"):
        GGUFFile.open(renamed)


def three_parts(folder: Path) -> list[Path]:
    (folder / "a").mkdir()
    first = write_tiny_gguf(folder / "a" / "m.gguf", split_max_tensors=8)   # 20 tensors: 3 parts
    return sorted(first.parent.iterdir())


def test_a_part_out_of_place_is_refused(tmp_path):
    parts = three_parts(tmp_path)
    parts[1].write_bytes(parts[2].read_bytes())
    with pytest.raises(GGUFError, match=r"m-00002-of-00003.gguf: split.no is 2, expected 1 \(part 2 of 3 of "):
        GGUFFile.open(parts[0])


def test_a_tensor_in_two_parts_is_refused(tmp_path):
    parts = three_parts(tmp_path)
    name = next(iter(open_checked(parts[2])[1]))   # a tensor of part 3, written into part 1 too
    rewrite(parts[0], tmp_path / "doubled.gguf", extra={name: np.ones(4, np.float32)},
            keys={"split.tensors.count": (21, gguf.GGUFValueType.INT32)})
    shutil.move(tmp_path / "doubled.gguf", parts[0])
    with pytest.raises(GGUFError, match=rf"m-00003-of-00003.gguf: tensor {name} is also in part 1 of m-00001"):
        GGUFFile.open(parts[0])


def test_a_tensor_count_other_than_the_parts_hold_is_refused(tmp_path):
    parts = three_parts(tmp_path)
    rewrite(parts[0], tmp_path / "counted.gguf", keys={"split.tensors.count": (21, gguf.GGUFValueType.INT32)})
    shutil.move(tmp_path / "counted.gguf", parts[0])
    with pytest.raises(GGUFError, match=r"m-00001-of-00003.gguf: split.tensors.count is 21 but the 3 parts hold 20"):
        GGUFFile.open(parts[0])
