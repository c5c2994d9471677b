"""Why the server loads the model and decodes on one thread: libgomp's spin-wait throttling.

torch's CPU build runs parallel ops on libgomp (OpenMP). Every thread that has run a parallel op
keeps its own OpenMP team, and once the process holds more OpenMP threads than cores, libgomp
cuts its spin-wait between parallel regions to almost nothing, so each of the ~100 parallel ops
of a step pays a futex wake-up. This script times the batch-1 decode step of the default model:

  1. in a fresh process, model loaded and stepped on one worker thread (the server's way);
  2. then stepped on a second thread (two OpenMP teams now: the loader's and this one);
  3. then on the main thread, and on yet another thread after that.

    .venv/bin/python playground/omp_threads.py
Each case runs in its own process (the effect depends on which threads ran torch before).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time

CASES = {
    "load + step on one worker thread (server)": ["worker"],
    "load on a worker, step on another thread": ["worker", "other"],
    "load + step on the main thread": ["main"],
    "load + step on main, then step on a thread": ["main", "other"],
}


def step_ms(model, cache) -> float:
    from slotserver.runtime.batch import Batch, SeqChunk

    times = []
    for i in range(15):
        batch = Batch.build([SeqChunk(0, 131 + i, [500])])
        t = time.perf_counter()
        model.forward(batch, cache)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def run_case(plan: list[str]) -> float:
    from cpu_formats import setup

    box: dict = {}

    def on_thread(fn):
        th = threading.Thread(target=lambda: box.update(out=fn()))
        th.start()
        th.join()
        return box["out"]

    first = plan[0]
    if first == "main":
        model, cache, _ = setup("bfloat16:auto4")
        ms = step_ms(model, cache)
    else:  # the worker loads and steps, and stays alive (as the server's engine thread does)
        ready, done = threading.Event(), threading.Event()

        def worker():
            m, c, _ = setup("bfloat16:auto4")
            box.update(model=m, cache=c, ms=step_ms(m, c))
            ready.set()
            done.wait()

        threading.Thread(target=worker, daemon=True).start()
        ready.wait()
        model, cache, ms = box["model"], box["cache"], box["ms"]
    for _ in plan[1:]:
        ms = on_thread(lambda: step_ms(model, cache))
    return ms


def main() -> None:
    if len(sys.argv) > 1:
        print(f"{run_case(sys.argv[1:]):.1f}")
        return
    print("batch-1 decode step of the default model (bfloat16, auto4), median ms; each case in a fresh process")
    for name, plan in CASES.items():
        out = subprocess.run([sys.executable, __file__, *plan], capture_output=True, text=True, check=True)
        print(f"  {name:45} {out.stdout.strip().splitlines()[-1]:>7} ms")


if __name__ == "__main__":
    main()
