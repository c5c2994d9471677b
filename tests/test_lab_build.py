"""`slotserver lab build` (slotserver/lab/build.py): every module that compiles a C library is a
job, no two of those running at once building the same library; a build leaves the library in the cache, where the next
load finds it; a kernel whose C does not compile is named with its file and line, and fails the
command."""

from __future__ import annotations

import argparse
import shutil

import pytest

from slotserver.cli.lab import run_build
from slotserver.lab import build
from slotserver.lab.build import build_all, phases
from slotserver.runtime import native
from slotserver.runtime.kernel_set import KernelSet
from slotserver.runtime.loader import default_dir

needs_cc = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on this machine")


def test_every_library_has_a_job_and_no_two_at_once_build_the_same_one():
    first, then = phases(default_dir("kernels"))
    names = {j.name for j in first + then}
    assert {"attention", "paged_attention", "qmatmul", "moe_matmul", "rms_norm", "scaled_add", "truncated", "kv_rows",
            "step_graph"} <= names
    libs = [lib for j in first for lib in j.libraries]
    assert len(libs) == len(set(libs)) and {"attention", "qmatmul", "moe_matmul"} <= set(libs)   # each once, at once
    assert all(j.libraries & set(libs) for j in then)   # the rest only load what the first phase built
    assert first[0].cost == max(j.cost for j in first + then)   # the longest compile starts first
    kernels = KernelSet.load().modules   # every kernel module that holds a library is a job
    assert {op for op, m in kernels.items() if getattr(m.module, "_LIB", None) is not None} <= names


def _folder(tmp_path, broken: bool):
    """A kernels folder with gelu_mul and rms_norm, their C edited (a library this process has not
    loaded yet) and, if `broken`, rms_norm's with a syntax error on its last line."""
    folder = tmp_path / "kernels"
    folder.mkdir(parents=True)
    src = default_dir("kernels")
    for name in ("gelu_mul.py", "gelu_mul.c", "rms_norm.py", "rms_norm.c", "_q8_1.py"):
        shutil.copy(src / name, folder / name)
        if name.endswith(".c"):
            (folder / name).write_text((folder / name).read_text() + f"/* {tmp_path.name} */\n")
    if broken:
        with open(folder / "rms_norm.c", "a") as f:
            f.write("int broken( {\n")
    return folder


@needs_cc
def test_a_build_leaves_each_library_in_the_cache_and_names_a_broken_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SLOTSERVER_NATIVE", raising=False)
    monkeypatch.setattr(build, "ROOT", tmp_path / "no_package")   # the kernels' jobs only (the package's are imported here)
    results = {name: error for name, _, error in build_all(_folder(tmp_path / "a", broken=False), 1)}
    assert results["gelu_mul"] is None and results["rms_norm"] is None
    built = {p.name.rsplit("-", 1)[0] for p in (tmp_path / "cache" / "native").glob("*.so")}
    assert built == {"gelu_mul", "rms_norm", "probe"}, built

    folder = _folder(tmp_path / "b", broken=True)
    last = len((folder / "rms_norm.c").read_text().splitlines())
    code = run_build(argparse.Namespace(kernels_dir=folder, jobs=1))
    out = capsys.readouterr().out
    assert code == 1 and f"rms_norm.c:{last}:" in out and "1 failed" in out, out


def test_without_native_kernels_there_is_nothing_to_build(monkeypatch, capsys):
    monkeypatch.setenv("SLOTSERVER_NATIVE", "0")
    assert run_build(argparse.Namespace(kernels_dir=None, jobs=None)) == 0
    assert "nothing to compile" in capsys.readouterr().out


@needs_cc
def test_a_library_left_to_its_torch_form_fails_the_build(tmp_path, monkeypatch, capsys):
    """A compiler that cannot build (here `false`) makes each library a warning and a torch form at
    load time, not an error: the build must still say so and exit 1, not report success."""
    monkeypatch.setenv("SLOTSERVER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SLOTSERVER_NATIVE", raising=False)
    monkeypatch.setenv("CC", "false")
    monkeypatch.setattr(native, "_unavailable", set())   # what this process could not build, restored after
    monkeypatch.setattr(build, "ROOT", tmp_path / "no_package")
    code = run_build(argparse.Namespace(kernels_dir=_folder(tmp_path, broken=False), jobs=1))
    out = capsys.readouterr().out
    assert code == 1 and "gelu_mul: not built, its torch form serves: gelu_mul" in out and "2 failed" in out, out
