"""One rank of the tensor-parallel tests (tests/test_tensor_parallel.py runs two, with torchrun's
environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

`python tests/tp_ranks.py OUT.json SLOTS_DIR FIXTURE...`: for the default model and each fixture, `generate` greedy with
top-8 log-probabilities through --tp 2's session; then the first fixture served in float32
(n_parallel 3) through HTTP: SERVE_CASES, a slot restored from SLOTS_DIR/base.bin (saved by the
test's server without --tp) and one saved to SLOTS_DIR/tp.bin, a kernel swap, then layout swaps
(`swap_layouts`). Rank 0 writes what a user saw.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import DEFAULT_LAYOUT, ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.generate import GenRequest, generate
from slotserver.model.model import LlamaModel
from slotserver.model.sampling.params import SamplingParams
from slotserver.parallel.session import TPSession

PROMPT = [1, 17, 42, 99, 7, 23, 5]
N_PREDICT = 6
SLOT_PROMPT = "The capital of France is"
SERVE_CASES = [   # (path, body): what both servers answer
    ("/completion", {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "n_probs": 8,
                     "ignore_eos": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a color."}], "n": 2,
                              "temperature": 0, "max_tokens": 8}),
    ("/completion", {"prompt": "Is the sky blue? Answer:", "grammar": 'root ::= " " ("yes" | "no") "."',
                     "temperature": 0, "n_predict": 8}),
]


def gen_case(model: LlamaModel, tp: TPSession) -> list:
    """[(token, [(id, logprob) x 8]) per step] of a greedy run, through every rank (model: prepared)."""
    if not tp.leads:
        tp.serve(model)
        return []
    req = GenRequest(PROMPT, N_PREDICT, SamplingParams(temperature=0.0, n_probs=8), ignore_eos=True)
    out = generate(model, [req], frozenset(), make_cache=lambda spec: tp.cache(spec, DEFAULT_LAYOUT))[0]
    tp.stop()
    return [[t, top] for t, top in zip(out.tokens, out.top)]


def serve_cases(tp: TPSession, bundle, slots: Path) -> dict:
    """The model (prepared) behind the HTTP app, its engine's steps and KV edits on every rank."""
    if not tp.leads:
        tp.serve(bundle.model)
        return {}
    from starlette.testclient import TestClient
    from slotserver.server import ServerConfig, ServerState, create_app

    engine = Engine(bundle, EngineConfig(n_parallel=3, ctx_size=3 * 256, slot_save_path=slots))
    tp.attach(engine)
    engine.tp_session = tp
    engine.start()
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path), slot_save_path=slots))
    state.set_loaded(bundle, engine)
    try:
        with TestClient(create_app(state)) as client:
            return run_http(client)
    finally:
        engine.stop()
        tp.stop()


def run_http(client) -> dict:
    seen = {"cases": [client.post(path, json=body).json() for path, body in SERVE_CASES]}
    body = {"prompt": SLOT_PROMPT, "n_predict": 6, "temperature": 0, "id_slot": 1, "cache_prompt": True}
    wait_for(client.app.state.server.config.slot_save_path / "base.bin")
    r = client.post("/slots/1?action=restore", json={"filename": "base.bin"})
    assert r.status_code == 200, r.text
    seen["restored"] = client.post("/completion", json=body).json()
    seen["props"] = client.get("/props").json()["tensor_parallel"]
    seen["kernels"] = swap_kernel(client.app.state.server.engine, Path(slots_of(client)) / "kernels")
    client.post("/completion", json=dict(body, id_slot=2))
    seen["saved"] = client.post("/slots/2?action=save", json={"filename": "tp.bin"}).json()
    seen["layouts"] = swap_layouts(client, Path(slots_of(client)) / "layouts")
    return seen


def slots_of(client) -> Path:
    return client.app.state.server.config.slot_save_path


def swap_kernel(engine, folder: Path) -> list[str]:
    """A lab kernel swap on rank 0's engine thread (rms_norm, a copy with one more comment line):
    -> every rank's rms_norm version afterwards, and the new one's."""
    import shutil
    from slotserver.runtime.kernel_set import load_kernel
    from slotserver.runtime.loader import read_source

    port = engine.port
    old = Path(port.kernels.modules["rms_norm"].path)
    folder.mkdir(exist_ok=True)
    for name in (old.name, *read_source(old).files()):   # the module, its .c files and its parts
        shutil.copy(old.parent / name, folder / name)
    for f in old.parent.glob("*.h"):
        shutil.copy(f, folder / f.name)
    new = folder / old.name
    new.write_text(new.read_text() + "\n# a new version, the same kernel\n")
    loaded = load_kernel(read_source(new))
    engine.call(lambda: port.swap_kernels(port.kernels.with_module("rms_norm", loaded))).result()
    tp = engine.tp_session
    ranks = engine.call(lambda: tp.report(engine.bundle.model, None)).result()
    return [r["kernels"]["rms_norm"] for r in ranks] + [loaded.version]


def swap_layouts(client, folder: Path) -> dict:
    """Lab layout swaps on both ranks while slots hold a conversation (its history in slots 0 and 2),
    the lab serving a copy of layouts/ in `folder`, its watcher on: the continuation before any
    swap (slot 0); /lab/layout to paged, the continuation from slot 2's migrated cells; a save of
    paged.py (the watcher); the swap back; swaps refused (`refusals`); the continuation again.
    -> what each answered, each rank's layout after each."""
    import shutil

    engine, tp = client.app.state.server.engine, client.app.state.server.engine.tp_session
    lab = engine.lab
    folder.mkdir(exist_ok=True)
    for f in lab.layouts_dir.glob("*.py"):
        shutil.copy(f, folder / f.name)
    lab.layouts_dir = folder   # as --layouts-dir would; the serving layout stays the bundled file
    engine.loop.start_watcher()

    def ranks() -> list:
        return [r["layout"] for r in engine.call(lambda: tp.report(engine.bundle.model, engine.cache.inner)).result()]

    turn = {"prompt": SLOT_PROMPT, "n_predict": 6, "temperature": 0, "cache_prompt": True}
    history = client.post("/completion", json=dict(turn, id_slot=0)).json()["content"]   # slot 2's, too
    cont = dict(turn, prompt=SLOT_PROMPT + history, n_probs=8)
    seen = {"start": ranks(), "before": client.post("/completion", json=dict(cont, id_slot=0)).json()}
    seen["paged"] = client.post("/lab/layout", json={"layout": "paged"}).json()
    seen["paged_ranks"] = ranks()
    seen["after"] = client.post("/completion", json=dict(cont, id_slot=2)).json()
    seen["saved"] = save_and_wait(lab, folder / "paged.py")
    seen["saved_ranks"] = ranks()
    engine.loop.watcher.stop()
    engine.loop.watcher = None   # the refusals below write files it would validate
    seen["back"] = client.post("/lab/layout", json={"layout": seen["start"][0]["name"]}).json()
    seen["back_ranks"] = ranks()
    seen["refused"] = refusals(client, engine, folder, ranks)
    seen["again"] = client.post("/completion", json=dict(cont, id_slot=2)).json()
    return seen


def save_and_wait(lab, path: Path, timeout: float = 60.0) -> dict:
    """An edit saved to the serving layout's file: -> the lab's event for it (the watcher's swap)."""
    seq = max([e["seq"] for e in lab.events_since(0)], default=0)
    path.write_text(path.read_text() + "\n# saved again: the same layout\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [e for e in lab.events_since(seq) if e["file"] == str(path) and e["result"] != "accepted"]
        if done:
            return done[0]
        time.sleep(0.05)
    return {}


def refusals(client, engine, folder: Path, ranks) -> dict:
    """A layout whose copy_stream forgets V (/lab/layout: the validator refuses it), one that
    validates (on rank 0) but cannot be made on rank 1 (refused on every rank), and one whose file
    is saved again between validation and the swap (the port's swap: rank 0 refuses it before
    sending anything). -> the answers and each rank's layout after each."""
    from slotserver.runtime.layouts import LAYOUT_CONTRACT
    from slotserver.runtime.loader import load_source, read_source

    text = (folder / "head_seq_dim.py").read_text().replace('NAME = "head_seq_dim"', 'NAME = "broken"')
    (folder / "broken.py").write_text(text.replace("self.v_store[:, dst, :, :n] = self.v_store[:, src, :, :n]", "pass"))
    r = client.post("/lab/layout", json={"layout": "broken"})
    seen = {"invalid": [r.status_code, r.json()], "invalid_ranks": ranks()}
    make = "def create(spec: KVSpec) -> HeadSeqDim:\n"
    fails = "    if torch.distributed.get_rank() != 0:\n        raise MemoryError('not on this rank')\n"
    (folder / "rank0_only.py").write_text(text.replace(make, make + fails).replace('"broken"', '"rank0_only"'))
    r = client.post("/lab/layout", json={"layout": "rank0_only"})
    seen |= {"rank1_fails": [r.status_code, r.json()], "rank1_fails_ranks": ranks()}
    edited = folder / "paged_hnd.py"
    edited.write_text(edited.read_text() + "\n# validated\n")
    loaded = load_source(read_source(edited), LAYOUT_CONTRACT)
    edited.write_text(edited.read_text() + "# saved again before the swap\n")
    try:
        engine.call(lambda: engine.port.swap_layout(loaded)).result()
        seen["changed"] = "swapped"
    except Exception as e:  # noqa: BLE001 - what the test checks
        seen["changed"] = f"{type(e).__name__}: {e}"
    seen["changed_ranks"] = ranks()
    seen["kernel"] = refuse_kernel(engine, folder.parent / "kernels")
    return seen


def refuse_kernel(engine, folder: Path) -> dict:
    """A kernel swap that rank 1 cannot load (its import fails there): -> the error, every rank's
    rms_norm version before and after."""
    from slotserver.runtime.kernel_set import load_kernel
    from slotserver.runtime.loader import read_source

    port, tp = engine.port, engine.tp_session
    versions = lambda: [r["kernels"]["rms_norm"] for r in tp.report(engine.bundle.model, None)]  # noqa: E731
    seen = {"before": engine.call(versions).result()}
    path = folder / "rms_norm.py"
    path.write_text(path.read_text() + "\nif __import__('torch').distributed.get_rank() != 0:\n"
                                       "    raise ImportError('not on this rank')\n")
    loaded = load_kernel(read_source(path))
    try:
        engine.call(lambda: port.swap_kernels(port.kernels.with_module("rms_norm", loaded))).result()
        seen["error"] = "swapped"
    except Exception as e:  # noqa: BLE001 - what the test checks
        seen["error"] = f"{type(e).__name__}: {e}"
    seen["after"] = engine.call(versions).result()
    return seen


def wait_for(path: Path, timeout: float = 120.0) -> None:
    """The test's own server saves base.bin while these ranks run (they start together)."""
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def main(out: str, slots: str, *fixtures: str) -> None:
    """Every fixture, then the default model (float32: 4 s to load), through `generate`; then the
    first fixture served (prepared last: the session's plan is the last prepared model's)."""
    tp = TPSession.start(2, [])
    t0 = time.perf_counter()
    served = ModelBundle.load(ModelConfig(Path(fixtures[0]), dtype="float32", threads=1))
    seen = {"generate": {}}
    for path in fixtures:
        model = LlamaModel.load(path, torch.float32, kernels=served.model.kernels)
        tp.prepare(model)
        seen["generate"][path] = gen_case(model, tp)
    default = LlamaModel.load(default_model_path(), torch.float32, kernels=served.model.kernels)
    tp.prepare(default)
    seen["generate"]["default"] = gen_case(default, tp)
    seen["times"] = [time.perf_counter() - t0]
    tp.prepare(served.model)
    seen["serve"] = serve_cases(tp, served, Path(slots))
    seen["times"].append(time.perf_counter() - t0)
    if tp.leads:
        Path(out).write_text(json.dumps(seen))


if __name__ == "__main__":
    main(*sys.argv[1:])

