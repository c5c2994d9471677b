"""Shared test fixtures: the embedded model path, its metadata and the llama.cpp reference data."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest


def _pin_xdist_worker() -> None:
    """`make test` runs pytest-xdist workers; each keeps to its own share of the usable CPUs.

    Why: a worker's torch/OpenMP pool sized for every core, beside another worker doing the same,
    oversubscribes the machine, and spinning OpenMP threads then lose whole time slices (measured on
    2 cores: an 8-prompt batching test 4.7 s alone, 18 s beside the other worker). Pinned, the
    engine's default -t (the physical cores it may use, cpu_features.physical_cores) follows the
    share, and so do the servers and CLIs the tests start, which inherit the affinity. Tests that
    ask for 2 threads (-t 2, --tp 2) still get them, time-sliced on the share. It runs before torch
    is imported: OpenMP reads the usable CPUs once, when it loads, and only throttles its spinning
    when it knows it has more threads than CPUs (test_thread_tuner's 1-vs-2-thread test took 28 s
    in a suite run pinned after the import; pinned before it, alone under taskset, 3.7 s)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    os.environ["SLOTSERVER_TEST_CPUS"] = ",".join(map(str, cpus))   # for a child that needs them all
    if len(cpus) >= count:
        share = cpus[int(worker.removeprefix("gw")) % count::count]
        os.sched_setaffinity(0, share)


_pin_xdist_worker()

# llama-server's variables stand for `serve` flags (cli/llama_env.py): a developer's shell that sets
# LLAMA_ARG_CTX_SIZE must not change what the tests' servers and parsers see. Tests set their own.
for _name in [n for n in os.environ if n.startswith(("LLAMA_ARG_", "LLAMA_API_KEY"))]:
    del os.environ[_name]

# A suite started from a background job (`make test &` in a script) inherits SIGINT ignored, and
# so would every server and CLI it starts (an ignored signal stays ignored across exec, and Python
# then installs no KeyboardInterrupt handler): the Ctrl-C tests would see nothing happen. A
# handler, unlike SIG_IGN, is reset to the default in a child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import torch  # noqa: E402  (after the pinning, see there)

# The files that take longest under `make test` (longest first, as timed on the 2-core host on
# 2026-11-28: 57 s for test_triton_kernels down to 11 s), run first:
# pytest-xdist hands whole files out in collection order (--dist loadfile), so a long file collected
# last (alphabetically, test_triton_* and test_tensor_parallel are) keeps one worker busy while the
# other has finished. Only the order changes; a file missing here runs after these, as collected.
LONGEST_FIRST = ("test_triton_kernels", "test_qmatmul_gpu", "test_tensor_parallel", "test_server_e2e",
                 "test_lab", "test_triton_generation", "test_sampling", "test_scheduler_properties",
                 "test_install", "test_native", "test_gpt_oss", "test_model_reference", "test_router_http",
                 "test_arch_fixtures", "test_lab_under_load", "test_gemv_step", "test_lab_layout_swaps_http")


def pytest_collection_modifyitems(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))   # stable: each file's own order kept

from hypothesis import settings  # noqa: E402

# Property tests run a fixed, seeded search by default, so a run's verdict is reproducible and CI
# never fails on a draw the developer could not see. HYPOTHESIS_PROFILE=explore searches afresh
# (new seeds each run) when hunting for bugs; whatever it finds becomes an @example.
settings.register_profile("default", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from slotserver.model.default_model import default_model_path

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def triton_interpreter() -> None:
    """Skips a test that runs Triton kernels under TRITON_INTERPRET=1 where the installed triton's
    interpreter cannot run them: triton 3.6 (a GPU image's, not replaced there) fails on `range(0, K, ...)`
    over a scalar argument inside a called @jit function. CI's triton (3.9) runs them; a card runs the
    compiled kernels' own tests beside."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("triton")
    except PackageNotFoundError:
        pytest.skip("triton is not installed")
    if tuple(int(p) for p in found.split(".")[:2]) < (3, 9):
        pytest.skip(f"triton {found}'s interpreter cannot run these kernels (needs 3.9)")


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="session")
def smollm_metadata(smollm_path) -> dict:
    """The GGUF key/value metadata of the default model as plain Python values: our own reader's,
    which test_gguf_file.py's test_metadata_equals_gguf_readers checks against gguf's GGUFReader
    (6 s a read of this file on one core, where ours takes 0.14 s)."""
    from slotserver.model.gguf_file import GGUFFile

    return GGUFFile.open(smollm_path).metadata


@pytest.fixture(scope="session")
def tokenize_fixture() -> list[dict]:
    return json.loads((FIXTURES / "tokenize.json").read_text())


@pytest.fixture(scope="session")
def greedy_fixture() -> list[dict]:
    return json.loads((FIXTURES / "greedy_f32.json").read_text())


@pytest.fixture(scope="session")
def model_f32(smollm_path):
    from slotserver.model.model import LlamaModel

    return LlamaModel.load(smollm_path, torch.float32, max_pos=1024)


@pytest.fixture(scope="session")
def model_bf16(smollm_path):
    from slotserver.model.model import LlamaModel

    return LlamaModel.load(smollm_path, torch.bfloat16, max_pos=1024)


@pytest.fixture(scope="session")
def tokenizer(smollm_metadata):
    from slotserver.model.text.tokenizer import Tokenizer

    return Tokenizer.from_metadata(smollm_metadata)
