"""The lab's benchmark: save-to-active latency of kernel edits and layout switches while serving.

A copy of kernels/ and layouts/ is served by an engine on the default model with one request
decoding; each round saves an equivalent edit of a kernel (alternating with the original, so every
save changes the file's bytes) through the watcher, or switches the layout through the lab, and
reads the latency the lab recorded (from the first file event to the swap at a step boundary,
debounce included). Prints p50 and max per kind.

    .venv/bin/python playground/lab_latency.py --rounds 20
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.engine.request import Request
from slotserver.runtime.loader import default_dir
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.default_model import default_model_path
from slotserver.model.sampling.sampler import SamplingParams


def wait_event(lab, seen: int, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [e for e in lab.events_since(seen) if e["result"] in ("swapped", "refused")]
        if new:
            return new[0]
        time.sleep(0.002)
    raise TimeoutError("no lab event")


def kernel_saves(engine: Engine, kfile: Path, rounds: int) -> list[float]:
    original, out, seen = kfile.read_text(), [], 0
    for i in range(rounds):
        kfile.write_text(original + f"\n# edit {i}: a comment changes the bytes, not the code\n")
        event = wait_event(engine.lab, seen)
        seen = event["seq"]
        assert event["result"] == "swapped", event
        out.append(event["latency_ms"])
    kfile.write_text(original)
    wait_event(engine.lab, seen)
    return out


def layout_switches(engine: Engine, rounds: int) -> list[float]:
    names, out = ["head_seq_dim", "seq_head_dim"], []
    for i in range(rounds):
        event = engine.lab.switch_layout(names[i % 2]).result(timeout=60)
        assert event["result"] == "swapped", event
        out.append(event["latency_ms"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--kernel", default="rms_norm")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lab-latency-"))
    kdir, ldir = root / "kernels", root / "layouts"
    shutil.copytree(default_dir("kernels"), kdir)
    shutil.copytree(default_dir("layouts"), ldir)
    bundle = ModelBundle.load(ModelConfig(default_model_path(), kernels_dir=kdir, layouts_dir=ldir))
    engine = Engine(bundle, EngineConfig(n_parallel=2, ctx_size=4096)).start(watch=True)
    try:
        h = engine.submit(Request(tuple(bundle.tokenizer.encode("Once upon a time")), SamplingParams(temperature=0),
                                  n_predict=100000, ignore_eos=True))
        results = {f"kernel save ({args.kernel}.py)": kernel_saves(engine, kdir / f"{args.kernel}.py", args.rounds),
                   "layout switch": layout_switches(engine, args.rounds)}
        h.cancel()
    finally:
        engine.stop()
        shutil.rmtree(root, ignore_errors=True)
    for kind, ms in results.items():
        print(f"{kind:28} p50 {statistics.median(ms):7.1f} ms   max {max(ms):7.1f} ms   ({len(ms)} rounds)")


if __name__ == "__main__":
    main()
